//! A per-thread text buffer that the front ends reuse for store keys and header values, so that
//! deciding a request allocates nothing but the one header value the response keeps.

use std::cell::Cell;

/// A buffer that grew past this many bytes (a huge key) is dropped rather than kept.
const KEEP_AT_MOST: usize = 1024;

thread_local! {
    static BUFFER: Cell<String> = const { Cell::new(String::new()) };
}

/// Runs `f` with this thread's buffer, empty. Re-entrant: a nested call gets a buffer of its
/// own (the thread's is taken out while `f` runs, never borrowed).
pub(crate) fn with_buffer<R>(f: impl FnOnce(&mut String) -> R) -> R {
    let mut buffer = BUFFER.take();
    buffer.clear();
    let result = f(&mut buffer);
    if buffer.capacity() <= KEEP_AT_MOST {
        BUFFER.set(buffer);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_reused_empty_and_nested_calls_get_their_own() {
        with_buffer(|b| b.push_str("outer"));
        with_buffer(|outer| {
            assert!(outer.is_empty());
            assert!(outer.capacity() >= 5, "the first call's buffer is reused");
            outer.push_str("outer");
            with_buffer(|inner| {
                assert!(inner.is_empty());
                inner.push_str("inner");
            });
            assert_eq!(outer, "outer");
        });
        with_buffer(|b| b.push_str(&"x".repeat(KEEP_AT_MOST + 1)));
        with_buffer(|b| assert!(b.capacity() <= KEEP_AT_MOST));
    }
}
