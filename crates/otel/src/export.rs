//! The export task: spans from the queue, in batches, posted as OTLP/HTTP protobuf.
//!
//! A batch leaves when it is full or when its first span has waited `batch_delay`. A request
//! that fails (collector down, refused) is logged and its spans counted as failed; spans are not
//! retried, so a collector that is down costs one request per batch, never memory.

use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::assemble::SpanRecord;
use crate::encode::{Resolver, request};
use crate::options::{Counters, OtelOptions};

/// How long one export request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Stops the export task after it has sent what is queued.
#[derive(Debug)]
pub struct ExportHandle {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ExportHandle {
    /// Sends the spans still queued, then stops the task (at most one request timeout).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

pub(crate) fn spawn(
    options: OtelOptions,
    resolve: Resolver,
    rx: mpsc::Receiver<SpanRecord>,
    counters: Counters,
) -> ExportHandle {
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(run(options, resolve, rx, counters, stopped));
    ExportHandle {
        stop: Some(stop),
        task: Some(task),
    }
}

async fn run(
    options: OtelOptions,
    resolve: Resolver,
    mut rx: mpsc::Receiver<SpanRecord>,
    counters: Counters,
    mut stopped: oneshot::Receiver<()>,
) {
    let url = format!("{}/v1/traces", options.endpoint.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new());
    let poster = Poster {
        client,
        url,
        resolve,
        counters,
    };
    let mut batch: Vec<SpanRecord> = Vec::with_capacity(options.batch_size);
    loop {
        // Wait for a first span (or the end).
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            span = rx.recv() => match span {
                Some(span) => batch.push(span),
                None => break,
            },
        }
        // Fill the batch until it is full or its first span has waited long enough.
        let due = tokio::time::sleep(options.batch_delay);
        tokio::pin!(due);
        let mut stopping = false;
        while batch.len() < options.batch_size {
            tokio::select! {
                biased;
                _ = &mut stopped => { stopping = true; break; }
                () = &mut due => break,
                span = rx.recv() => match span {
                    Some(span) => batch.push(span),
                    None => { stopping = true; break; }
                },
            }
        }
        poster.post(&mut batch).await;
        if stopping {
            break;
        }
    }
    // Shutting down: what is queued now goes out too.
    while let Ok(span) = rx.try_recv() {
        batch.push(span);
        if batch.len() >= options.batch_size {
            poster.post(&mut batch).await;
        }
    }
    poster.post(&mut batch).await;
}

struct Poster {
    client: reqwest::Client,
    url: String,
    resolve: Resolver,
    counters: Counters,
}

impl Poster {
    /// Posts `batch` and empties it.
    async fn post(&self, batch: &mut Vec<SpanRecord>) {
        if batch.is_empty() {
            return;
        }
        let body = request(batch, &self.resolve).encode_to_vec();
        let n = batch.len() as u64;
        batch.clear();
        let sent = self
            .client
            .post(&self.url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await;
        match sent {
            Ok(resp) if resp.status().is_success() => {
                self.counters.exported.inc_by(n);
            }
            Ok(resp) => {
                self.counters.failed.inc_by(n);
                tracing::warn!(url = %self.url, status = %resp.status(), spans = n, "OTLP export refused");
            }
            Err(e) => {
                self.counters.failed.inc_by(n);
                tracing::warn!(url = %self.url, error = %e, spans = n, "OTLP export failed");
            }
        }
    }
}
