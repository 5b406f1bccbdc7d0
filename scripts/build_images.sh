#!/usr/bin/env bash
# Builds hora's container images from this source tree, with podman (or
# docker where podman is missing):
#   hora:cpu   docker/Dockerfile.cpu: Open MPI, PyTorch (CPU), the examples
#   hora:cuda  docker/Dockerfile.cuda: the CUDA/NCCL build; building needs no
#              GPU, running its GPU code does
# Usage:
#   scripts/build_images.sh [cpu] [cuda] [--base auto|registry|local]
#   scripts/build_images.sh --engine-args    # how to call the engine on this host:
#     line 1 the engine with its global flags, line 2 the flags of run/build
# With no image named, builds hora:cpu.
#
# --base picks the base images:
#   registry  the Dockerfiles' own (python:3.11-slim, nvidia/cuda:...-devel)
#   local     made here from Debian's packages with mmdebstrap (no registry
#             needed): Debian 12 with Python 3.11, cached as a tarball in
#             $HORA_IMAGE_CACHE (default ~/.cache/hora/images); for hora:cuda,
#             the CUDA toolkit from PyPI's wheels on top (docker/Dockerfile.cuda-pypi)
#   auto      registry when its python:3.11-slim can be pulled, else local
#
# The host's pip settings reach the build: wheel directories in PIP_FIND_LINKS
# (a local PyTorch wheel, say) and the CA bundle in PIP_CERT (a TLS-inspecting
# proxy), through the build context "pip-extra". PyTorch's CPU index is used
# when it answers. HORA_IMAGE_EXTRAS overrides the extras installed
# (default "torch examples bench"); HORA_CUDA_VERSION picks the CUDA toolkit of a
# local CUDA base (default 13.0); HORA_CUDA_ARCHITECTURES the GPU
# architectures hora:cuda is compiled for (e.g. "90"; default: the build's
# list for its CUDA version).
set -euo pipefail
cd "$(dirname "$0")/.."

base=auto
images=()
print_engine_args=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --base) base="$2"; shift 2;;
    --base=*) base="${1#--base=}"; shift;;
    --engine-args) print_engine_args=1; shift;;
    cpu|cuda) images+=("$1"); shift;;
    -h|--help) sed -n '2,28p' "$0"; exit 0;;
    *) echo "build_images.sh: unknown argument '$1' (see --help)" >&2; exit 2;;
  esac
done
case "$base" in auto|registry|local) ;; *)
  echo "build_images.sh: --base must be auto, registry or local, not '$base'" >&2; exit 2;;
esac
[ "${#images[@]}" -gt 0 ] || images=(cpu)

if command -v podman >/dev/null 2>&1; then
  engine=podman
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  engine=docker
else
  echo "build_images.sh: needs podman (apt-get install podman) or a running Docker engine" >&2
  exit 1
fi

# Flags a container needs on this host. Two kinds of host need some:
# - without CAP_SYS_RESOURCE (inside another sandbox, say) the runtime cannot
#   raise the open-file and process limits to podman's defaults, so they are
#   kept at the host's own;
# - crun refuses a hybrid cgroup v1/v2 hierarchy, runc accepts it.
run_args() {
  [ "$engine" = podman ] || return 0
  local capeff
  capeff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  if [ $(( 16#$capeff >> 24 & 1 )) -eq 0 ]; then
    local nofile nproc
    nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
    [ "$nofile" = unlimited ] && nofile=1048576
    { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
    printf '%s\n' --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc"
  fi
}
mapfile -t eargs < <(run_args)
if [ "$engine" = podman ] && grep -q ' /sys/fs/cgroup/unified cgroup2 ' /proc/mounts \
   && command -v runc >/dev/null 2>&1; then
  engine="podman --runtime runc"
fi
if [ "$print_engine_args" = 1 ]; then
  echo "$engine"
  echo "${eargs[*]}"
  exit 0
fi

cache="${HORA_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hora/images}"
mkdir -p "$cache"
now() { date +%s; }
started=$(now)

# --- the build context pip-extra: host wheels and CA bundle -------------------
extra="$cache/pip-extra"
rm -rf "$extra"; mkdir -p "$extra/wheels"
for dir in ${PIP_FIND_LINKS:-}; do
  dir="${dir#file://}"
  [ -d "$dir" ] || continue
  for whl in "$dir"/*.whl; do
    [ -e "$whl" ] || continue
    ln "$whl" "$extra/wheels/" 2>/dev/null || cp "$whl" "$extra/wheels/"
  done
done
for ca in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}"; do
  if [ -n "$ca" ] && [ -f "$ca" ]; then cp "$ca" "$extra/ca.crt"; break; fi
done
echo "pip-extra: $(ls "$extra/wheels" | wc -l) wheel(s) from PIP_FIND_LINKS$([ -f "$extra/ca.crt" ] && echo ", CA bundle from the host")"
# hora:cuda gets the CA bundle only: a local PyTorch wheel is most likely the
# CPU build, which pip would prefer to PyPI's CUDA build of the same version.
extra_cuda="$cache/pip-extra-cuda"
rm -rf "$extra_cuda"; mkdir -p "$extra_cuda"
[ -f "$extra/ca.crt" ] && cp "$extra/ca.crt" "$extra_cuda/"

reachable() { curl -s -o /dev/null --max-time 10 ${extra_ca:+--cacert "$extra_ca"} "$1"; }
extra_ca=""; [ -f "$extra/ca.crt" ] && extra_ca="$extra/ca.crt"

# --- base images ------------------------------------------------------------
local_base=localhost/hora-base:bookworm-python3.11
if [ "$base" = auto ]; then
  if $engine image inspect python:3.11-slim >/dev/null 2>&1 \
     || timeout 60 $engine pull -q docker.io/library/python:3.11-slim >/dev/null 2>&1; then
    base=registry
  else
    base=local
    echo "docker.io cannot be reached: the base images are made here ($local_base)"
  fi
fi
if [ "$base" = local ] && ! $engine image inspect "$local_base" >/dev/null 2>&1; then
  tarball="$cache/debian-bookworm-python3.11.tar"
  if [ ! -f "$tarball" ]; then
    command -v mmdebstrap >/dev/null || {
      echo "build_images.sh: --base local needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
    t=$(now)
    echo "making $tarball with mmdebstrap (Debian 12, Python 3.11)..."
    mmdebstrap --quiet --variant=minbase --format=tar \
      --include=python3,python3-venv,python3-dev,ca-certificates \
      bookworm "$tarball.part" http://deb.debian.org/debian
    mv "$tarball.part" "$tarball"
    echo "base rootfs made in $(( $(now) - t )) s"
  fi
  $engine import --change 'CMD ["python3"]' "$tarball" "$local_base" >/dev/null
fi

build() {  # build TAG DOCKERFILE PIP-EXTRA-DIR [BUILD-ARG...]
  local tag="$1" file="$2" pip_extra="$3"; shift 3
  local t; t=$(now)
  local args=()
  for a in "$@"; do args+=(--build-arg "$a"); done
  local previous
  previous=$($engine image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  echo "building $tag from $file..."
  $engine build "${eargs[@]}" -f "$file" -t "$tag" --build-context "pip-extra=$pip_extra" \
    "${args[@]}" .
  # The image this build replaced, now untagged: removed unless a container
  # still uses it (each would otherwise keep its own compiled layer).
  if [ -n "$previous" ] && [ "$previous" != "$($engine image inspect --format '{{.Id}}' "$tag")" ]; then
    $engine rmi "$previous" >/dev/null 2>&1 || true
  fi
  echo "$tag built in $(( $(now) - t )) s; size $($engine image inspect --format '{{.Size}}' "$tag" \
    | awk '{printf "%.0f MB", $1 / 1e6}')"
}

torch_index=https://download.pytorch.org/whl/cpu
if ! reachable "$torch_index/"; then
  echo "$torch_index cannot be reached: PyTorch comes from PyPI and PIP_FIND_LINKS"
  torch_index=""
fi
extras="${HORA_IMAGE_EXTRAS:-torch examples bench}"
for image in "${images[@]}"; do
  case "$image" in
    cpu)
      bargs=("TORCH_INDEX_URL=$torch_index" "HORA_EXTRAS=$extras")
      [ "$base" = local ] && bargs+=("BASE_IMAGE=$local_base")
      build hora:cpu docker/Dockerfile.cpu "$extra" "${bargs[@]}";;
    cuda)
      bargs=("HORA_EXTRAS=$extras" "HORA_CUDA_ARCHITECTURES=${HORA_CUDA_ARCHITECTURES:-}")
      if [ "$base" = local ]; then
        cuda="${HORA_CUDA_VERSION:-13.0}"
        build "localhost/hora-cuda-base:$cuda" docker/Dockerfile.cuda-pypi "$extra_cuda" \
          "BASE_IMAGE=$local_base" "CUDA_VERSION=$cuda"
        bargs+=("CUDA_IMAGE=localhost/hora-cuda-base:$cuda")
      fi
      build hora:cuda docker/Dockerfile.cuda "$extra_cuda" "${bargs[@]}"
      echo "checking the build inside hora:cuda:"
      $engine run --rm "${eargs[@]}" hora:cuda horarun --check-build;;
  esac
done
echo "done in $(( $(now) - started )) s"
