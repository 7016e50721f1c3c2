//! A bound on how many large inputs are parsed at once.

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
    let mut running = count.lock().unwrap_or_else(|e| e.into_inner());
    while *running >= MAX_LARGE_PARSES {
        running = freed.wait(running).unwrap_or_else(|e| e.into_inner());
    }
    *running += 1;
    ParsePermit(true)
}

impl Drop for ParsePermit {
    fn drop(&mut self) {
        if self.0 {
            let (count, freed) = &LARGE_PARSES;
            *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            freed.notify_one();
        }
    }
}
