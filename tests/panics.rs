//! The constructors meant for literals (`Quota::per_second`, `.burst`, `Header::new`)
//! panic on a bad value with a message that names the fix, and the panic points at the
//! caller's line, not inside tollgate. One test in its own binary: it sets the panic hook.

use std::panic::{self, Location};
use std::sync::{Arc, Mutex};

use tollgate::Quota;
use tollgate::key::Header;

/// Runs `f`, which must panic; answers the file and line the panic points at, and its
/// message.
fn panic_site(f: impl FnOnce() + panic::UnwindSafe) -> (String, u32, String) {
    let seen = Arc::new(Mutex::new(None));
    let hook_seen = seen.clone();
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let location = info.location().unwrap();
        let message = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        *hook_seen.lock().unwrap() = Some((location.file().to_owned(), location.line(), message));
    }));
    let result = panic::catch_unwind(f);
    panic::set_hook(previous);
    assert!(result.is_err(), "no panic");
    seen.lock().unwrap().take().expect("the hook saw the panic")
}

#[test]
fn literal_constructors_panic_at_the_callers_line_with_the_fix() {
    let here = Location::caller().file().to_owned();

    let line = line!() + 2;
    let (file, at, message) = panic_site(|| {
        let _ = Quota::per_second(0);
    });
    assert_eq!((file.as_str(), at), (here.as_str(), line), "{message}");
    assert!(message.contains("at least 1"), "{message}");

    let line = line!() + 2;
    let (file, at, message) = panic_site(|| {
        let _ = Quota::per_minute(10).burst(0);
    });
    assert_eq!((file.as_str(), at), (here.as_str(), line), "{message}");
    assert!(message.contains("at least 1"), "{message}");

    let line = line!() + 1;
    let (file, at, message) = panic_site(|| drop(Header::new("bad header")));
    assert_eq!((file.as_str(), at), (here.as_str(), line), "{message}");
    assert!(message.contains("try_new"), "{message}");

    // The fallible twins answer errors instead.
    assert_eq!(
        Quota::per_minute(10).try_burst(0).unwrap_err().field(),
        "burst"
    );
    assert_eq!(Header::try_new("bad header").unwrap_err().field(), "header");
    // Any case is a valid header name, kept lowercase.
    assert_eq!(
        format!("{:?}", Header::new("X-Api-Key")),
        format!("{:?}", Header::new("x-api-key"))
    );
}
