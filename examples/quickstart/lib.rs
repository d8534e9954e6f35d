//! The package of tollgate's quickstart, `examples/quickstart.rs`: run it from the
//! repository's root with `cargo run --example quickstart`. This library is empty; the
//! package exists so that the example builds with nothing but what it uses.
