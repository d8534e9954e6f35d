//! Throwaway Redis servers and clusters for the tests.
