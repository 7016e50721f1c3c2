//! The reader of what swank and slynk servers print, on any text. It must not panic, an error
//! must point into the text, and whatever reads must print (as `Sexp`'s `Display` does for logs
//! and error messages) to text that reads back as the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use swank_mcp::swank::read;

fuzz_target!(|data: &[u8]| {
    // Frames reach the reader as `String`s: the frame decoder has already made them UTF-8.
    let Ok(text) = std::str::from_utf8(data) else { return };
    match read(text) {
        Ok(value) => {
            let printed = value.to_string();
            match read(&printed) {
                Ok(again) => assert_eq!(again, value, "{text:?} printed as {printed:?}"),
                Err(error) => panic!("{text:?} printed as {printed:?}, which does not read: {error}"),
            }
        }
        Err(error) => assert!(text.is_char_boundary(error.offset), "{error} in {text:?}"),
    }
});
