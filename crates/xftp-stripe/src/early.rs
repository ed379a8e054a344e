//! Starting a transfer before all its connections are open: a lost SYN
//! costs its connection a second (Linux's first retransmission timeout),
//! and the others need not wait for it (docs/protocol.md).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The wait for a transfer's connections: the first as long as it takes,
/// then the others `early` more (all of them, however long, without
/// `early`).
#[derive(Debug)]
pub struct EarlyStart {
    early: Option<Duration>,
    until: Option<Instant>,
}

impl EarlyStart {
    /// Wait for the others `early` after the first (`None`: for all).
    pub fn new(early: Option<Duration>) -> Self {
        Self { early, until: None }
    }

    /// `next` (the next connection), or `None` once the others' time is up.
    pub async fn next<F: Future>(&self, next: F) -> Option<F::Output> {
        match self.until {
            Some(t) => tokio::time::timeout_at(t, next).await.ok(),
            None => Some(next.await),
        }
    }

    /// A connection is in: the others' time starts with the first.
    pub fn got_one(&mut self) {
        if self.until.is_none() {
            self.until = self.early.map(|e| Instant::now() + e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_is_awaited_the_others_for_a_while() {
        let mut w = EarlyStart::new(Some(Duration::from_millis(250)));
        let slow = tokio::time::sleep(Duration::from_secs(5));
        assert_eq!(w.next(slow).await, Some(()), "the first, however late");
        w.got_one();
        let in_time = tokio::time::sleep(Duration::from_millis(200));
        assert_eq!(w.next(in_time).await, Some(()));
        w.got_one();
        let late = tokio::time::sleep(Duration::from_millis(100));
        assert_eq!(w.next(late).await, None, "250 ms after the first");
        let mut all = EarlyStart::new(None);
        all.got_one();
        let slow = tokio::time::sleep(Duration::from_secs(5));
        assert_eq!(all.next(slow).await, Some(()));
    }
}
