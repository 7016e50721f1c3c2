//! A bound on how many large inputs are parsed at once.
//!
//! See docs/design.md, "Source files".

use crate::sync::{lock, wait};

/// Inputs at least this large count as large parses, of which only [`MAX_LARGE_PARSES`] run at
/// once: a parse takes a few times its input in memory while it runs.
pub const LARGE_PARSE: usize = 1024 * 1024;

/// How many large parses may run at once; more wait for one to finish.
pub const MAX_LARGE_PARSES: usize = 2;

static LARGE_PARSES: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// Held while a source tool parses its input: for an input of [`LARGE_PARSE`] bytes or more it
/// waits until fewer than [`MAX_LARGE_PARSES`] such parses run.
pub struct ParsePermit(bool);

/// Waits, for an input of [`LARGE_PARSE`] bytes or more, until fewer than [`MAX_LARGE_PARSES`]
/// such parses run; the permit lets the next one in when dropped.
pub fn parse_permit(input_len: usize) -> ParsePermit {
    if input_len < LARGE_PARSE {
        return ParsePermit(false);
    }
    let (count, freed) = &LARGE_PARSES;
    let mut running = lock(count);
    while *running >= MAX_LARGE_PARSES {
        running = wait(freed, running);
    }
    *running += 1;
    ParsePermit(true)
}

impl Drop for ParsePermit {
    fn drop(&mut self) {
        if self.0 {
            let (count, freed) = &LARGE_PARSES;
            *lock(count) -= 1;
            freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn no_more_than_two_large_parses_run_at_once() {
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (running, most) = (running.clone(), most.clone());
                std::thread::spawn(move || {
                    let _permit = parse_permit(LARGE_PARSE);
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        // Small inputs never wait.
        let _small = [parse_permit(LARGE_PARSE - 1), parse_permit(0), parse_permit(10)];
        for thread in threads {
            thread.join().expect("thread");
        }
        assert_eq!(most.load(Ordering::SeqCst), MAX_LARGE_PARSES);
    }
}
