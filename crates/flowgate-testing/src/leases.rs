//! Lease stores for tests of what happens when leases cannot be had.

use flowgate::lease::{Acquired, LeaseId, Leases, Terms};
use flowgate::store::{BoxFuture, StoreError};

/// A lease store that is away: every call fails with [`StoreError::Unavailable`], as a Redis
/// that refuses connections does — for the fail modes (`closed`: 503, `open`: uncounted).
#[derive(Debug, Clone, Copy, Default)]
pub struct AwayLeases;

/// The error every call of [`AwayLeases`] returns.
fn away() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

impl Leases for AwayLeases {
    fn acquire<'a>(
        &'a self,
        _: &'a str,
        _: &'a Terms,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async { Err(away()) })
    }

    fn renew<'a>(
        &'a self,
        _: &'a str,
        _: LeaseId,
        _: &'a Terms,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Err(away()) })
    }

    fn release<'a>(&'a self, _: &'a str, _: LeaseId) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Err(away()) })
    }

    fn held<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async { Err(away()) })
    }
}
