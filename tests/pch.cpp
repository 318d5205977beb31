// Holds the precompiled Catch2 header that every host test reuses (see CMakeLists.txt).
