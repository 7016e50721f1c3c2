//! Locking a `std::sync::Mutex` the one way this crate does. A lock is poisoned only when a task
//! panicked while holding it; every state kept under one here stays consistent at each step, so
//! the lock is taken regardless rather than spreading the panic to every later caller.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The guard of `mutex`, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `condvar` with `guard`, as [`lock`] takes a lock.
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(|e| e.into_inner())
}
