#!/usr/bin/env bash
# Builds today's EFA user-space stack into a private prefix, for softefa run's compatibility tests
# (docs/cabi.md, "Today's stack"): rdma-core 64 (libibverbs, libefa, pyverbs and its tests, the
# ibv_* programs) and libfabric 2.6 (the efa provider) with fabtests, from the release archives.
#
#   cabi/thirdparty/build.sh            build, or reuse the cached build; prints the prefix last
#   cabi/thirdparty/build.sh --prefix   print the prefix the archives map to, build nothing
#                                       (exit status 1 when that prefix is not built yet)
#   cabi/thirdparty/build.sh --archive NAME
#                                       print where archive NAME would come from (a path, or
#                                       "download URL"), fetch nothing
#
# Environment:
#   SOFTEFA_THIRDPARTY   directory holding the archives, looked at first (then
#                        ../shared/thirdparty beside the clone, then earlier downloads; else they
#                        are downloaded from the projects' release pages: archives.sh)
#   SOFTEFA_STACK_CACHE  cache root (default /var/cache/softefa-stack as root, else
#                        ${XDG_CACHE_HOME:-~/.cache}/softefa-stack)
#   JOBS                 parallel jobs (default: the number of CPUs)
#
# The archives are checked against their SHA-256 sums in SHA256SUMS, wherever they come from. The
# result is cached outside the clone under CACHE/<key>, the key being a hash of the two archives'
# sums and of this recipe's version, so a second run with the same archives does nothing. Nothing is installed
# into /usr or /usr/local: every install goes through a staging DESTDIR and is refused if any
# file lands outside the prefix (rdma-core's install_manifest.txt is checked the same way).
# Debian's own rdma-core and libfabric packages are not touched and keep working beside it.
set -euo pipefail

# Bump when the recipe below changes what gets built.
RECIPE=2

here=$(cd "$(dirname "$0")" && pwd)
. "$here/archives.sh"
cache=$softefa_cache
rdma=rdma-core-64.0
fab=libfabric-2.6.0

# The key hashes these two archives' lines of SHA256SUMS, in the file's order, as it did when
# they were the file's only lines: the sums of other scripts' archives do not move it.
sums=$(grep -E "  ($rdma|$fab)\.tar\.gz\$" "$here/SHA256SUMS")
key=$( (echo "$sums"; echo "recipe $RECIPE") | sha256sum | cut -c1-16)
prefix=$cache/$key

case "${1:-}" in
--prefix)
  echo "$prefix"
  [ -e "$prefix/.complete" ]
  exit ;;
--archive)
  archive_source "${2:?--archive needs an archive name}"
  exit ;;
esac

log() { echo "build-stack: $*" >&2; }

if [ -e "$prefix/.complete" ]; then
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

for tool in cmake ninja pkg-config cython3 autoreconf automake libtoolize make cc; do
  command -v "$tool" >/dev/null || {
    log "missing $tool; on Debian 12: apt-get install cmake ninja-build pkg-config libnl-3-dev" \
      "libnl-route-3-dev libudev-dev python3-dev cython3 autoconf automake libtool"
    exit 1
  }
done

rdma_tgz=$(archive_get "$rdma.tar.gz") || exit 1
fab_tgz=$(archive_get "$fab.tar.gz") || exit 1
log "archives (checked against $here/SHA256SUMS): $rdma_tgz $fab_tgz"

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -e "$prefix/.complete" ]; then # another build finished while this one waited
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

jobs=${JOBS:-$(nproc)}
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
rm -rf "$prefix"

tar -C "$work" -xzf "$rdma_tgz"
tar -C "$work" -xzf "$fab_tgz"

# Debian's interpreter (it has Cython; a pyenv one does not). Every path rdma-core would put
# outside the prefix (pyverbs into the interpreter's dist-packages, systemd helpers into /lib,
# sysusers.d into /usr/lib)
# is pointed inside it.
py=/usr/bin/python3
pylib=$prefix/lib/python3/dist-packages
log "rdma-core 64: configure"
cmake -S "$work/$rdma" -B "$work/$rdma/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_PYTHON_ARCH_LIB="$pylib" \
  -DCMAKE_INSTALL_SYSTEMD_BINDIR="$prefix/lib/systemd" \
  -DSYSUSERS_DIR="$prefix/lib/sysusers.d" \
  -DCMAKE_INSTALL_RPATH="$prefix/lib" \
  -DPYTHON_EXECUTABLE="$py" \
  -DNO_MAN_PAGES=1 -DENABLE_STATIC=0 >"$work/rdma-cmake.log" 2>&1 ||
  { tail -40 "$work/rdma-cmake.log" >&2; exit 1; }
log "rdma-core 64: build"
ninja -C "$work/$rdma/build" -j "$jobs" >"$work/rdma-build.log" 2>&1 ||
  { tail -40 "$work/rdma-build.log" >&2; exit 1; }
DESTDIR=$stage ninja -C "$work/$rdma/build" install >"$work/rdma-install.log" 2>&1 ||
  { tail -40 "$work/rdma-install.log" >&2; exit 1; }
outside=$(grep -v "^$prefix/" "$work/$rdma/build/install_manifest.txt" || true)
if [ -n "$outside" ]; then
  log "rdma-core's install_manifest.txt lists files outside $prefix:"; echo "$outside" >&2; exit 1
fi

# libfabric and fabtests find rdma-core 64 in the prefix, at build time and (rpath) at run time.
export PKG_CONFIG_PATH=$stage$prefix/lib/pkgconfig
ldflags="-Wl,-rpath,$prefix/lib -L$stage$prefix/lib"
# No static library (libtool would compile every source twice; fabtests and the tests link the
# shared one), as rdma-core's ENABLE_STATIC=0 above.
log "libfabric 2.6: configure"
(cd "$work/$fab" && ./autogen.sh >"$work/fab-autogen.log" 2>&1 &&
  ./configure --prefix="$prefix" --enable-efa="$stage$prefix" --disable-static --disable-verbs --disable-usnic \
    --disable-psm2 --disable-psm3 --disable-opx --disable-ucx --disable-cxi --disable-lpp \
    LDFLAGS="$ldflags" >"$work/fab-configure.log" 2>&1) ||
  { tail -40 "$work/fab-configure.log" >&2; exit 1; }
grep -q 'HAVE_EFADV_QUERY_QP_WQS 1' "$work/$fab/config.h" ||
  { log "libfabric's configure did not find efadv_query_qp_wqs in rdma-core 64"; exit 1; }
log "libfabric 2.6: build"
make -C "$work/$fab" -j "$jobs" >"$work/fab-build.log" 2>&1 ||
  { tail -40 "$work/fab-build.log" >&2; exit 1; }
make -C "$work/$fab" install DESTDIR="$stage" >"$work/fab-install.log" 2>&1 ||
  { tail -40 "$work/fab-install.log" >&2; exit 1; }

log "fabtests 2.6: configure and build"
(cd "$work/$fab/fabtests" && ./autogen.sh >"$work/ft-autogen.log" 2>&1 &&
  ./configure --prefix="$prefix" --with-libfabric="$stage$prefix" \
    LDFLAGS="-Wl,-rpath,$prefix/lib" >"$work/ft-configure.log" 2>&1) ||
  { tail -40 "$work/ft-configure.log" >&2; exit 1; }
make -C "$work/$fab/fabtests" -j "$jobs" >"$work/ft-build.log" 2>&1 ||
  { tail -40 "$work/ft-build.log" >&2; exit 1; }
make -C "$work/$fab/fabtests" install DESTDIR="$stage" >"$work/ft-install.log" 2>&1 ||
  { tail -40 "$work/ft-install.log" >&2; exit 1; }

# Everything staged must sit under the prefix.
outside=$(cd "$stage" && find . \( -type f -o -type l \) | sed 's|^\.||' | grep -v "^$prefix/" || true)
if [ -n "$outside" ]; then
  log "files staged outside $prefix:"; echo "$outside" | head -20 >&2; exit 1
fi
# libtool archives and pkg-config files written while staging name the staging directory.
{ grep -rlF "$stage" "$stage$prefix" --include='*.la' --include='*.pc' 2>/dev/null || true; } |
  xargs -r sed -i "s|$stage||g"

mv "$stage$prefix" "$prefix"
cp "$work/$rdma/build/install_manifest.txt" "$prefix/rdma-core-install_manifest.txt"
cat >"$prefix/.complete" <<EOT
rdma-core 64.0 and libfabric 2.6.0 (with fabtests), recipe $RECIPE
$sums
EOT
log "built: $prefix"
echo "$prefix"
