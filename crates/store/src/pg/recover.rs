//! Recovery on PostgreSQL, scoped to one replica: when a replica starts, the turns and calls that
//! *it* left open (it died: crash, `kill -9`, a lost machine) get their `interrupted` outcomes.
//! The rows of other replicas are left to them while they are alive; a replica whose lease ran
//! out is declared dead and its open calls are recorded by a survivor (liveness.rs), which reads
//! them with `read::open_turns` as a restart does.

use postgres::Client;
use toolwarden_protocol::Timestamp;

use super::write::PgWriter;
use crate::recover::{Interruption, close_turns};
use crate::redact::RedactedEvent;
use crate::redact::Redactor;
use crate::writer::TrailBackend as _;

/// Records the outcome of every call and turn `replica` left open; returns how many calls were
/// interrupted and this replica's last `seq` afterwards.
pub(crate) fn recover(
    client: &mut Client,
    writer: &mut PgWriter,
    replica: &str,
    redactor: &Redactor,
    now: Timestamp,
) -> Result<(usize, u64), String> {
    let mut seq = super::read::last_seq(client, replica)?;
    let open = super::read::open_turns(client, replica)?;
    let (events, interrupted) = close_turns(&mut seq, now, open, &Interruption::Restart);
    if !events.is_empty() {
        let items: Vec<RedactedEvent<'_>> = events
            .iter()
            .map(|event| RedactedEvent {
                event,
                body: redactor.body(event),
            })
            .collect();
        writer.write(&items)?;
    }
    Ok((interrupted, seq))
}
