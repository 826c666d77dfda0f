// The one source of ll_test_pch, the target whose precompiled header every test program reuses
// (lifeline_gtest in the top-level CMakeLists.txt). It has no tests of its own.
