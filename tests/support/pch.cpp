// The translation unit that holds the tests' precompiled header (support/pch.hpp).
