#!/usr/bin/env bash
# Builds the C++ tests (tests/cpp: the engine's pieces with ranks as threads)
# against the core's static libraries and runs them with ctest. Needs what
# `pip install .` needs (a C++17 compiler, CMake, an MPI: the one in .venv
# if there is one) plus GoogleTest: an installed one is used;
# otherwise Debian's googletest source package is downloaded with apt-get
# (no root needed) and unpacked into the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
# The MPI that `bash scripts/install.sh` put into .venv, if there is one.
if [ -x .venv/bin/mpicc ]; then export PATH="$PWD/.venv/bin:$PATH"; fi
build="${HORA_CPP_BUILD:-build/cpp-tests}"
mkdir -p "$build"
build="$(cd "$build" && pwd)"  # (an absolute path, given or not)
gtest_args=()
have_gtest() {
  [ -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] ||
    [ -f /usr/lib/cmake/GTest/GTestConfig.cmake ] || [ -f /usr/local/lib/cmake/GTest/GTestConfig.cmake ]
}
if [ -n "${HORA_GTEST_SOURCE_DIR:-}" ]; then
  gtest_args=("-DHORA_GTEST_SOURCE_DIR=$HORA_GTEST_SOURCE_DIR")
elif [ -f /usr/src/googletest/CMakeLists.txt ]; then
  gtest_args=("-DHORA_GTEST_SOURCE_DIR=/usr/src/googletest")
elif ! have_gtest; then
  source_dir="$build/googletest/usr/src/googletest"
  if [ ! -f "$source_dir/CMakeLists.txt" ]; then
    if ! command -v apt-get >/dev/null; then
      echo "GoogleTest is needed for the C++ tests: install it (libgtest-dev, gtest-devel, conda's gtest)" >&2
      echo "or point HORA_GTEST_SOURCE_DIR at a googletest source tree" >&2
      exit 1
    fi
    echo "fetching Debian's googletest source package for the C++ tests..."
    lists="$build/apt-lists"
    mkdir -p "$lists/partial" "$build/googletest"
    apt_opts=(-o "Dir::State::Lists=$lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    (cd "$build" && apt-get -qq "${apt_opts[@]}" download googletest >/dev/null 2>&1) || {
      apt-get -qq "${apt_opts[@]}" update >/dev/null
      (cd "$build" && apt-get -qq "${apt_opts[@]}" download googletest)
    }
    dpkg -x "$build"/googletest_*.deb "$build/googletest"
  fi
  gtest_args=("-DHORA_GTEST_SOURCE_DIR=$source_dir")
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DHORA_BUILD_PYTHON=OFF -DHORA_BUILD_TESTS=ON -DHORA_UNITY_BUILD=OFF \
  "${gtest_args[@]}" >"$build/configure.log" || { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target hora_cpp_tests >"$build/build.log" 2>&1 ||
  { tail -n 60 "$build/build.log" >&2; exit 1; }
cd "$build" && ctest --output-on-failure "$@"
