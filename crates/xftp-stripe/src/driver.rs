//! The part of the send and receive drivers that is the same: admitting
//! connections added mid-transfer and reaping connection tasks.

use std::future::Future;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::StripeError;

/// Connection tasks of one transfer; each ends with `T` (its connection,
/// when connections are kept open for the next transfer).
pub(crate) type Tasks<T> = JoinSet<Result<T, StripeError>>;

/// Wait for one event: a connection was added (start its task with
/// `spawn`; `open` turns false once no more can be added), or a connection
/// task ended (its error, if any, is returned; its output otherwise). The
/// caller must not call this with `open` false and `tasks` empty: there
/// is nothing to wait for.
pub(crate) async fn admit_or_reap<S, T, F, Fut>(
    added: &mut mpsc::UnboundedReceiver<(usize, S)>,
    open: &mut bool,
    tasks: &mut Tasks<T>,
    spawn: F,
) -> Result<Option<T>, StripeError>
where
    T: Send + 'static,
    F: FnOnce(usize, S) -> Fut,
    Fut: Future<Output = Result<T, StripeError>> + Send + 'static,
{
    tokio::select! {
        c = added.recv(), if *open => match c {
            Some((idx, s)) => {
                tasks.spawn(spawn(idx, s));
            }
            None => *open = false,
        },
        r = tasks.join_next(), if !tasks.is_empty() => match r {
            Some(Ok(Ok(t))) => return Ok(Some(t)),
            None => {}
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(e)) => return Err(StripeError::Aborted(e.to_string())),
        },
    }
    Ok(None)
}
