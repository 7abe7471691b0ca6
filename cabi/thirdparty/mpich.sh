#!/usr/bin/env bash
# Builds MPICH 4.0.2 with its ch4:ofi device (libfabric) into a private prefix, for softefa run's
# MPI tests (docs/cabi.md, "MPICH"). Debian 12's own mpich package is built for ch4:ucx only
# (mpichversion: "MPICH Device: ch4:ucx"; libmpich.so.12 links libucp, not libfabric), so it
# cannot reach an EFA device; this is the same release, from Debian's source package, configured
# for libfabric. It is built against Debian's libfabric 1.17 (libfabric-dev) and runs as well on
# libfabric 2.6 (the stack of build.sh) put first on LD_LIBRARY_PATH, as Open MPI does.
#
#   cabi/thirdparty/mpich.sh            build, or reuse the cached build; prints the prefix last
#   cabi/thirdparty/mpich.sh --prefix   print the prefix, build nothing (exit status 1 when it is
#                                       not built yet)
#   cabi/thirdparty/mpich.sh --archive  print where the archive would come from, fetch nothing
#
# Environment:
#   SOFTEFA_MPICH_SRC    directory holding mpich_4.0.2.orig.tar.xz, looked at first; then
#                        SOFTEFA_THIRDPARTY, ../shared/thirdparty beside the clone and earlier
#                        downloads (archives.sh); else it is fetched with apt-get source from
#                        deb.debian.org, bookworm (without apt-get: from the mirror's pool), and
#                        kept in CACHE/archives; SOFTEFA_DEBIAN_MIRROR names another mirror
#   SOFTEFA_STACK_CACHE  cache root, as for build.sh
#   JOBS                 parallel jobs (default: the number of CPUs)
#
# The archive is checked against its SHA-256 sum in SHA256SUMS (the one Debian's mpich_4.0.2-3.dsc
# gives). It is Debian's orig tarball, not MPICH's own release file: MPICH publishes a .tar.gz,
# which Debian recompressed, so that sum cannot check a download from mpich.org, and no such
# download is tried.
#
# The configuration: no shared-memory module (--with-ch4-shmmods=none: ranks on one host talk
# through libfabric, so every rank uses the device), no Fortran, C++ bindings or ROMIO, no static
# library (libtool would compile every source twice; the tests link the shared one), the
# dataloop datatype engine (yaksa's generated code alone takes longer to build than the rest),
# no hwloc, and the hydra process manager (mpiexec). Without hwloc MPICH knows nothing of NIC and
# memory locality, which it only uses to choose among NICs and bind memory: with it, MPICH 4.0.2
# asserts in MPI_Init ("mpir_hwtopo.c at line 560: io_device") that the PCI device libfabric
# names for the NIC is in the host's topology, and softefa's device is not a PCI device of the
# host (docs/cabi.md, "MPICH"). Nothing is installed outside the prefix: the install goes
# through a staging DESTDIR and is refused if any file lands elsewhere.
set -euo pipefail

# Bump when the recipe below changes what gets built.
RECIPE=3
archive=mpich_4.0.2.orig.tar.xz

here=$(cd "$(dirname "$0")" && pwd)
. "$here/archives.sh"
cache=$softefa_cache
sum=$(archive_sum "$archive")
key=$(echo "$sum recipe $RECIPE" | sha256sum | cut -c1-16)
prefix=$cache/mpich-$key

case "${1:-}" in
--prefix)
  echo "$prefix"
  [ -e "$prefix/.complete" ]
  exit ;;
--archive)
  archive_source "$archive" "${SOFTEFA_MPICH_SRC:-}"
  exit ;;
esac

log() { echo "build-mpich: $*" >&2; }

if [ -e "$prefix/.complete" ]; then
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

for tool in make cc pkg-config; do
  command -v "$tool" >/dev/null || { log "missing $tool"; exit 1; }
done
[ -e /usr/include/rdma/fabric.h ] ||
  { log "missing /usr/include/rdma/fabric.h; on Debian 12: apt-get install libfabric-dev"; exit 1; }

mkdir -p "$cache"
exec 9>"$cache/.lock-mpich"
flock 9
if [ -e "$prefix/.complete" ]; then # another build finished while this one waited
  log "cached: $prefix"
  echo "$prefix"
  exit 0
fi

jobs=${JOBS:-$(nproc)}
work=$(mktemp -d "$cache/.build-mpich.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage
rm -rf "$prefix"

txz=$(archive_get "$archive" "${SOFTEFA_MPICH_SRC:-}") || exit 1
log "archive (checked against $here/SHA256SUMS): $txz"
tar -C "$work" -xJf "$txz"

# MPICH's configure adds `pkg-config --static --libs libfabric` to every link: Debian's
# libfabric.pc lists its static dependencies there (psm, psm2, rdmacm), which are not installed
# and not needed by the shared library. A copy of the .pc without them comes first.
mkdir -p "$work/pc"
pc=$(pkg-config --variable=pcfiledir libfabric)/libfabric.pc
grep -v '^Libs.private' "$pc" >"$work/pc/libfabric.pc"
export PKG_CONFIG_PATH=$work/pc

log "MPICH 4.0.2 (ch4:ofi): configure"
src=$work/mpich-4.0.2
(cd "$src" && ./configure --prefix="$prefix" --with-device=ch4:ofi --with-libfabric=/usr \
  --with-ch4-shmmods=none --with-datatype-engine=dataloop --with-hwloc=no --with-pm=hydra \
  --disable-fortran --disable-cxx --disable-romio --disable-static --enable-fast=O2 --enable-g=none \
  LDFLAGS="-Wl,-rpath,$prefix/lib" >"$work/configure.log" 2>&1) ||
  { tail -40 "$work/configure.log" >&2; exit 1; }
log "MPICH 4.0.2 (ch4:ofi): build"
make -C "$src" -j "$jobs" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
make -C "$src" install DESTDIR="$stage" >"$work/install.log" 2>&1 ||
  { tail -40 "$work/install.log" >&2; exit 1; }

outside=$(cd "$stage" && find . \( -type f -o -type l \) | sed 's|^\.||' | grep -v "^$prefix/" || true)
if [ -n "$outside" ]; then
  log "files staged outside $prefix:"; echo "$outside" | head -20 >&2; exit 1
fi
# libtool archives and pkg-config files written while staging may name the staging directory.
{ grep -rlF "$stage" "$stage$prefix" --include='*.la' --include='*.pc' 2>/dev/null || true; } |
  xargs -r sed -i "s|$stage||g"
LD_LIBRARY_PATH=$stage$prefix/lib "$stage$prefix/bin/mpichversion" | grep -q 'ch4:ofi' || { log "the build is not ch4:ofi"; exit 1; }

mv "$stage$prefix" "$prefix"
cat >"$prefix/.complete" <<EOT
MPICH 4.0.2 (ch4:ofi, Debian's libfabric), recipe $RECIPE
$sum  $archive
EOT
log "built: $prefix"
echo "$prefix"
