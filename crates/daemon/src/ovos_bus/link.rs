//! One websocket connection to the OVOS messagebus, kept open: connected at start, connected
//! again with a capped, jittered backoff whenever it is lost (the bus restarted, a frame over
//! `[ovos] max_frame_bytes`), each connection announced to the owner with
//! [`LinkEvent::Connected`] so it can announce itself again.
//!
//! The bus sends every client every message, its own included, so the owner filters by type.
//! Frames that are not messages are logged (at most one line per kind every
//! [`DEFECT_LOG_EVERY`], with how many were left out) and skipped. Messages sent while the bus is
//! unreachable are dropped: the bus keeps nothing for a client that is not connected, and its
//! clients time out their own requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::message::{BusMessage, Defect};
use crate::backoff::Backoff;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages waiting to be written to one connection; past this a message is dropped (logged).
const OUTGOING: usize = 4096;
/// Messages read and not yet handled by the owner; the reader waits past this.
const INCOMING: usize = 4096;
/// The shortest time between two log lines about defective frames of one kind.
pub(crate) const DEFECT_LOG_EVERY: Duration = Duration::from_secs(10);
/// A connection that lasted this long starts the next backoff from its shortest wait.
const STABLE_AFTER: Duration = Duration::from_secs(5);

/// What the owner of a link hears.
#[derive(Debug)]
pub(crate) enum LinkEvent {
    /// A connection opened (the first, or again after a loss).
    Connected,
    /// A message arrived.
    Message(BusMessage),
    /// The connection was lost (it is opened again).
    Disconnected,
}

/// The state of a link, for `/status` and `/readyz`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct LinkStatus {
    /// The bus, credentials masked.
    pub url: String,
    /// Whether a connection is open.
    pub connected: bool,
    /// Connections opened after the first.
    pub reconnects: u64,
    /// Frames skipped because they were not messages, or were over the size cap.
    pub defective_frames: u64,
    /// Messages dropped because the bus was not connected or the connection fell behind.
    pub dropped_messages: u64,
    /// Why the last connection ended or failed, if one did.
    pub last_error: Option<String>,
}

/// Called whenever the link's state changes.
pub(crate) type OnChange = Box<dyn Fn(&LinkStatus) + Send + Sync>;

/// A kept-open connection to the bus. Sending is cheap and never waits.
pub(crate) struct Link {
    url: String,
    masked: String,
    max_frame_bytes: usize,
    /// The open connection's writer, `None` while disconnected.
    outgoing: Mutex<Option<mpsc::Sender<String>>>,
    connected: AtomicBool,
    connections: AtomicU64,
    defective: AtomicU64,
    dropped: AtomicU64,
    last_error: Mutex<Option<String>>,
    on_change: OnChange,
    /// Who owns the link, for logs: `door` or `source`.
    role: &'static str,
}

impl Link {
    /// Starts a link to `url`; its events go to the returned receiver until `stop` fires.
    pub(crate) fn start(
        role: &'static str,
        url: &str,
        max_frame_bytes: usize,
        on_change: OnChange,
        stop: CancellationToken,
    ) -> (Arc<Link>, mpsc::Receiver<LinkEvent>) {
        let link = Arc::new(Link {
            url: url.trim().to_owned(),
            masked: toolhost_settings::mask_url(url.trim()),
            max_frame_bytes,
            outgoing: Mutex::new(None),
            connected: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            defective: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            last_error: Mutex::new(None),
            on_change,
            role,
        });
        let (events, receiver) = mpsc::channel(INCOMING);
        link.changed();
        tokio::spawn(link.clone().run(events, stop));
        (link, receiver)
    }

    /// Sends `message`; `false` when it was dropped (not connected, or the connection is
    /// behind by [`OUTGOING`] messages).
    pub(crate) fn send(&self, message: &BusMessage) -> bool {
        let sender = lock(&self.outgoing).clone();
        let sent = sender.is_some_and(|sender| sender.try_send(message.serialize()).is_ok());
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            warn!(
                role = self.role,
                msg_type = %message.msg_type,
                "OVOS messagebus not connected or behind; message dropped"
            );
        }
        sent
    }

    /// Whether a connection is open.
    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The link's state.
    pub(crate) fn status(&self) -> LinkStatus {
        LinkStatus {
            url: self.masked.clone(),
            connected: self.is_connected(),
            reconnects: self.connections.load(Ordering::Relaxed).saturating_sub(1),
            defective_frames: self.defective.load(Ordering::Relaxed),
            dropped_messages: self.dropped.load(Ordering::Relaxed),
            last_error: lock(&self.last_error).clone(),
        }
    }

    fn changed(&self) {
        (self.on_change)(&self.status());
    }

    fn set_error(&self, error: String) {
        *lock(&self.last_error) = Some(error);
    }

    /// Connects, serves the connection until it is lost, waits, and connects again.
    async fn run(self: Arc<Self>, events: mpsc::Sender<LinkEvent>, stop: CancellationToken) {
        let mut backoff = Backoff::new();
        let mut failures: u64 = 0;
        let config = WebSocketConfig::default()
            .max_message_size(Some(self.max_frame_bytes))
            .max_frame_size(Some(self.max_frame_bytes));
        loop {
            let connect = tokio_tungstenite::connect_async_with_config(self.url.as_str(), Some(config), true);
            let opened = tokio::select! {
                () = stop.cancelled() => return,
                opened = tokio::time::timeout(CONNECT_TIMEOUT, connect) => opened,
            };
            match opened {
                Ok(Ok((socket, _response))) => {
                    failures = 0;
                    let (sender, outgoing) = mpsc::channel(OUTGOING);
                    *lock(&self.outgoing) = Some(sender);
                    self.connected.store(true, Ordering::Relaxed);
                    let first = self.connections.fetch_add(1, Ordering::Relaxed) == 0;
                    info!(role = self.role, url = %self.masked, reconnect = !first, "connected to the OVOS messagebus");
                    self.changed();
                    if events.send(LinkEvent::Connected).await.is_err() {
                        return;
                    }
                    let opened_at = Instant::now();
                    let ended = self.serve(socket, outgoing, &events, &stop).await;
                    *lock(&self.outgoing) = None;
                    self.connected.store(false, Ordering::Relaxed);
                    let Some(why) = ended else {
                        self.changed();
                        return;
                    };
                    warn!(role = self.role, url = %self.masked, error = %why, "OVOS messagebus connection lost; connecting again");
                    self.set_error(why);
                    self.changed();
                    if events.send(LinkEvent::Disconnected).await.is_err() {
                        return;
                    }
                    if opened_at.elapsed() >= STABLE_AFTER {
                        backoff.reset();
                    }
                }
                Ok(Err(err)) => self.failed(&mut failures, format!("cannot connect: {err}")),
                Err(_elapsed) => self.failed(
                    &mut failures,
                    format!("cannot connect: no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                ),
            }
            if !backoff.wait(&stop).await {
                return;
            }
        }
    }

    /// Logs the first failed attempt of an outage (the others at debug) and records it.
    fn failed(&self, failures: &mut u64, error: String) {
        *failures += 1;
        if *failures == 1 {
            warn!(role = self.role, url = %self.masked, error = %error, "OVOS messagebus unreachable; retrying with backoff");
        } else {
            debug!(role = self.role, url = %self.masked, error = %error, attempt = *failures, "OVOS messagebus still unreachable");
        }
        self.set_error(error);
        self.changed();
    }

    /// Serves one connection: frames in, messages out. Returns why it ended, `None` when `stop`
    /// fired.
    async fn serve<S>(
        &self,
        mut socket: tokio_tungstenite::WebSocketStream<S>,
        mut outgoing: mpsc::Receiver<String>,
        events: &mpsc::Sender<LinkEvent>,
        stop: &CancellationToken,
    ) -> Option<String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mut defects = DefectLog::default();
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
                    return None;
                }
                frame = outgoing.recv() => {
                    let Some(frame) = frame else { return Some("the writer closed".to_owned()) };
                    if let Err(err) = socket.send(Frame::text(frame)).await {
                        return Some(format!("cannot write to the bus: {err}"));
                    }
                }
                read = socket.next() => {
                    let bytes = match read {
                        None => return Some("the bus closed the connection".to_owned()),
                        Some(Ok(Frame::Text(text))) => text.as_bytes().to_vec(),
                        Some(Ok(Frame::Binary(bytes))) => bytes.to_vec(),
                        Some(Ok(Frame::Close(close))) => {
                            return Some(format!(
                                "the bus closed the connection{}",
                                close.map(|close| format!(" ({}: {})", close.code, close.reason)).unwrap_or_default()
                            ));
                        }
                        Some(Ok(_control)) => continue,
                        Some(Err(WsError::Capacity(err))) => {
                            self.defective.fetch_add(1, Ordering::Relaxed);
                            return Some(match err {
                                CapacityError::MessageTooLong { size, max_size } => format!(
                                    "a message of {size} bytes is over ovos.max_frame_bytes ({max_size}); \
                                     the connection cannot skip it"
                                ),
                                other => format!("{other} (ovos.max_frame_bytes is {})", self.max_frame_bytes),
                            });
                        }
                        Some(Err(err)) => return Some(format!("cannot read from the bus: {err}")),
                    };
                    match BusMessage::parse(&bytes) {
                        Ok(message) => {
                            if events.send(LinkEvent::Message(message)).await.is_err() {
                                return None;
                            }
                        }
                        Err(defect) => {
                            self.defective.fetch_add(1, Ordering::Relaxed);
                            defects.log(self.role, &defect, &bytes);
                        }
                    }
                }
            }
        }
    }
}

/// Throttles the log lines about defective frames: one per kind every [`DEFECT_LOG_EVERY`].
#[derive(Default)]
struct DefectLog {
    /// By kind: when the last line was written, and how many were left out since.
    last: std::collections::HashMap<std::mem::Discriminant<Defect>, (Option<Instant>, u64)>,
}

impl DefectLog {
    fn log(&mut self, role: &'static str, defect: &Defect, frame: &[u8]) {
        let now = Instant::now();
        let entry = self.last.entry(std::mem::discriminant(defect)).or_insert((None, 0));
        if entry.0.is_some_and(|last| now.duration_since(last) < DEFECT_LOG_EVERY) {
            entry.1 += 1;
            return;
        }
        let left_out = std::mem::take(&mut entry.1);
        entry.0 = Some(now);
        let preview: String = String::from_utf8_lossy(&frame[..frame.len().min(120)]).into_owned();
        warn!(
            role,
            error = %defect,
            bytes = frame.len(),
            preview = %preview,
            left_out,
            "skipped a frame of the OVOS messagebus that is not a message"
        );
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
