//! Shared harness for the root integration tests.
