#!/usr/bin/env bash
# C++ compiler wrapper for building Horovod 0.28.1 against torch >= 2.1 (envs/horovod.build.txt):
# Horovod's CMake sets -std=c++14 after any CXXFLAGS, torch's headers refuse anything below
# C++17. Every argument passes through unchanged except -std=c++14 / -std=gnu++14.
args=()
for arg in "$@"; do
    case "$arg" in
        -std=c++14) arg=-std=c++17 ;;
        -std=gnu++14) arg=-std=gnu++17 ;;
    esac
    args+=("$arg")
done
exec "${DLCOMPARE_REAL_CXX:-g++}" "${args[@]}"
