#!/usr/bin/env bash
# Builds UCX 1.21 with its EFA transport (`srd`, src/uct/ib/efa) against the rdma-core 64 of
# build.sh's stack, into a private prefix, for softefa run's UCX tests (docs/cabi.md, "UCX").
#
#   cabi/thirdparty/ucx.sh            build, or reuse the cached build; prints the prefix last
#   cabi/thirdparty/ucx.sh --prefix   print the prefix, build nothing (exit status 1 when it is
#                                     not built yet)
#
# Environment:
#   SOFTEFA_THIRDPARTY   directory holding ucx-1.21.0.tar.gz, looked at first (then
#                        ../shared/thirdparty beside the clone, then earlier downloads; else it is
#                        downloaded from the project's release page: archives.sh)
#   SOFTEFA_STACK        the stack's prefix (default: what build.sh prints, building it if need be)
#   SOFTEFA_STACK_CACHE  cache root, as for build.sh
#   JOBS                 parallel jobs (default: the number of CPUs)
#
# The archive is checked against its SHA-256 sum in SHA256SUMS, wherever it comes from. UCX is
# configured as upstream's release build (contrib/configure-release: no assertions, no logging
# below warnings) with its parameter checks on (--enable-params-check: a bad argument is refused
# with UCS_ERR_INVALID_PARAM, which UCX's gtest expects), --with-verbs pointing at the stack,
# --with-efa, --without-mlx5 (as upstream's EFA job builds: no mlx5 code and tests in a build for
# EFA), --enable-gtest and --disable-static (no static libraries: libtool would compile every
# source twice, and nothing links them), and every program and library gets an rpath to the
# stack's lib/, so UCX runs on rdma-core 64's libibverbs and libefa, not Debian's. UCX's own unit
# tests (test/gtest, which upstream never installs) are built in the same tree and installed as
# bin/ucx_gtest, linked as libtool links a program to be installed: its rpath names the prefix's
# lib/ and lib/ucx/ (libuct_ib is a module there) and the stack's lib/, not the build tree.
# The result is cached under CACHE/ucx-<key>, the key hashing the archive's sum, the stack's
# prefix (itself a hash of its archives) and this recipe's version. Nothing is installed outside
# the prefix: the install goes through a staging DESTDIR and is refused if any file lands elsewhere.
set -euo pipefail

# Bump when the recipe below changes what gets built.
RECIPE=4
archive=ucx-1.21.0.tar.gz

here=$(cd "$(dirname "$0")" && pwd)
. "$here/archives.sh"
cache=$softefa_cache
sum=$(archive_sum "$archive")

log() { echo "build-ucx: $*" >&2; }

if [ "${1:-}" = --prefix ]; then
  stack=${SOFTEFA_STACK:-$("$here/build.sh" --prefix || true)}
else
  stack=${SOFTEFA_STACK:-$("$here/build.sh")}
fi
key=$(echo "$sum $stack recipe $RECIPE" | sha256sum | cut -c1-16)
prefix=$cache/ucx-$key

if [ "${1:-}" = --prefix ]; then
  echo "$prefix"
  [ -e "$prefix/.complete" ]
  exit
fi

if [ -e "$prefix/.complete" ]; then
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

[ -e "$stack/include/infiniband/efadv.h" ] && [ -e "$stack/lib/libefa.so" ] ||
  { log "no rdma-core with libefa in $stack"; exit 1; }
for tool in autoreconf automake libtoolize make cc c++ pkg-config; do
  command -v "$tool" >/dev/null || {
    log "missing $tool; on Debian 12: apt-get install autoconf automake libtool make g++ pkg-config"
    exit 1
  }
done

mkdir -p "$cache"
exec 9>"$cache/.lock-ucx"
flock 9
if [ -e "$prefix/.complete" ]; then # another build finished while this one waited
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

jobs=${JOBS:-$(nproc)}
work=$(mktemp -d "$cache/.build-ucx.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
rm -rf "$prefix"

tgz=$(archive_get "$archive") || exit 1
tar -C "$work" -xzf "$tgz"
ucx=$work/ucx-1.21.0

# autogen.sh asks git for a submodule (external/gpunetio, for GPUs) the archive does not carry;
# that step fails harmlessly outside a clone.
log "UCX 1.21: configure"
(cd "$ucx" && ./autogen.sh >"$work/autogen.log" 2>&1 &&
  ./contrib/configure-release --prefix="$prefix" --with-verbs="$stack" --with-efa --without-mlx5 \
    --enable-params-check --enable-gtest --disable-static \
    --without-cuda --without-rocm --without-java --without-go --disable-doxygen-doc \
    LDFLAGS="-Wl,-rpath,$stack/lib -Wl,-rpath,$prefix/lib" >"$work/configure.log" 2>&1) ||
  { tail -40 "$work/autogen.log" "$work/configure.log" >&2; exit 1; }
grep -q '^#define HAVE_EFA_RMA 1' "$ucx/config.h" ||
  { log "UCX's configure did not find libefa's RDMA read and write caps in $stack"; exit 1; }
grep -q '^#define uct_ib_MODULES ".*:efa' "$ucx/config.h" ||
  { log "UCX's configure left out its EFA module"; exit 1; }
grep -q '^#define ENABLE_PARAMS_CHECK 1' "$ucx/config.h" ||
  { log "UCX's configure left its parameter checks off"; exit 1; }
grep -q '^#define HAVE_MLX5_DV 1' "$ucx/config.h" &&
  { log "UCX's configure built mlx5 support"; exit 1; }
# gtest is linked with -no-install, which gives it an rpath into the build tree (deleted below)
# and none to lib/ucx/; without it libtool links .libs/gtest for installation (rpath: the
# libraries' install directories) and leaves a wrapper script for the build tree.
sed -i 's/^\(gtest_LDFLAGS = .*\) -no-install /\1 /' "$ucx/test/gtest/Makefile"
grep -q '^gtest_LDFLAGS = .*-no-install' "$ucx/test/gtest/Makefile" &&
  { log "could not take -no-install out of test/gtest/Makefile"; exit 1; }
log "UCX 1.21: build, with its gtest"
make -C "$ucx" -j "$jobs" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
make -C "$ucx" install DESTDIR="$stage" >"$work/install.log" 2>&1 ||
  { tail -40 "$work/install.log" >&2; exit 1; }
# gtest's dlopen test libraries (test/gtest/ucm/test_dlopen) install into their own build
# directory ($PWD/.noinst, under the staging directory here), which only the build tree uses.
rm -rf "${stage:?}$work"
[ -x "$ucx/test/gtest/.libs/gtest" ] || { log "no test/gtest/.libs/gtest was built"; exit 1; }
install -m 0755 "$ucx/test/gtest/.libs/gtest" "$stage$prefix/bin/ucx_gtest"
rpath=$(readelf -d "$stage$prefix/bin/ucx_gtest" | sed -n 's/.*(R\(UN\)\?PATH).*\[\(.*\)\]$/\2/p')
case ":$rpath:" in
*":$prefix/lib/ucx:"*) ;;
*) log "ucx_gtest's rpath ($rpath) lacks $prefix/lib/ucx"; exit 1 ;;
esac
case ":$rpath:" in
*"$work"*) log "ucx_gtest's rpath ($rpath) names the build tree"; exit 1 ;;
esac

outside=$(cd "$stage" && find . \( -type f -o -type l \) | sed 's|^\.||' | grep -v "^$prefix/" || true)
if [ -n "$outside" ]; then
  log "files staged outside $prefix:"; echo "$outside" | head -20 >&2; exit 1
fi
[ -e "$stage$prefix/lib/ucx/libuct_ib_efa.so" ] || { log "no libuct_ib_efa.so was built"; exit 1; }
# libtool archives and pkg-config files written while staging may name the staging directory.
{ grep -rlF "$stage" "$stage$prefix" --include='*.la' --include='*.pc' 2>/dev/null || true; } |
  xargs -r sed -i "s|$stage||g"

mv "$stage$prefix" "$prefix"
cat >"$prefix/.complete" <<EOT
UCX 1.21.0 (--with-efa, gtest as bin/ucx_gtest) against $stack, recipe $RECIPE
$sum  $archive
EOT
log "built: $prefix"
echo "$prefix"
