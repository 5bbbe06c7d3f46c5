//! Round trips on the wire: a TCP proxy between a counted drain's pool and the server, which
//! counts the exchanges the client waits for, whoever sends them (the crate or the baseline)
//! and however the driver sends them. sqlx's statement log misses some: it does not log
//! PostgreSQL's `BEGIN` (queued as a simple query, then awaited), nor a statement's
//! preparation, nor the ping of a pool's `test_before_acquire`.
//!
//! - PostgreSQL: each `ReadyForQuery` the server sends ends one, the answer to a `Sync` (a
//!   prepared statement's execution, or its preparation) or a simple `Query` (`BEGIN`).
//! - MySQL/MariaDB: each command the client sends (a packet of sequence number 0) but those
//!   answered by nothing (`COM_QUIT`, `COM_STMT_SEND_LONG_DATA`, `COM_STMT_CLOSE`).
//!
//! Proxied connections run without TLS, so that the proxy reads the messages' frames.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);

/// Round trips counted so far in the process.
pub(crate) fn round_trips() -> u64 {
    ROUND_TRIPS.load(Ordering::Relaxed)
}

/// A database's protocol, as far as counting round trips goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Postgres,
    MySql,
}

/// Starts a proxy to `host:port` on a free local port, which it returns; it runs until the
/// process ends.
pub(crate) async fn proxy(wire: Wire, host: String, port: u16) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let local = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let host = host.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect((host.as_str(), port)).await else {
                    return;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let ((client_read, client_write), (server_read, server_write)) =
                    (client.into_split(), server.into_split());
                // Each direction is framed where its messages tell the round trips.
                let (requests, replies) = match wire {
                    Wire::Postgres => (None, Some(Frames::new(wire))),
                    Wire::MySql => (Some(Frames::new(wire)), None),
                };
                tokio::join!(
                    pipe(client_read, server_write, requests),
                    pipe(server_read, client_write, replies),
                );
            });
        }
    });
    Ok(local)
}

/// Copies one direction of a connection, counting its messages with `frames`.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frames: Option<Frames>) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(frames) = &mut frames {
            frames.feed(&buffer[..n]);
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Splits a byte stream into the protocol's messages, as they arrive in pieces.
#[derive(Debug)]
struct Frames {
    wire: Wire,
    /// The current message's first bytes, up to [`HEADER`].
    header: Vec<u8>,
    /// Bytes of the current message still to pass.
    rest: usize,
}

/// PostgreSQL: the type and the length (4 bytes, itself included). MySQL: the length (3
/// bytes, the header excluded), the sequence number, and the payload's first byte (a command's
/// code).
const HEADER: usize = 5;

impl Frames {
    fn new(wire: Wire) -> Self {
        Frames {
            wire,
            header: Vec::with_capacity(HEADER),
            rest: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.rest > 0 {
                let n = self.rest.min(bytes.len());
                self.rest -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < HEADER {
                continue;
            }
            let h = &self.header;
            let (ends_round_trip, rest) = match self.wire {
                Wire::Postgres => {
                    let length = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                    (h[0] == b'Z', length.saturating_sub(4))
                }
                Wire::MySql => {
                    let length = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
                    (
                        h[3] == 0 && !matches!(h[4], 0x01 | 0x18 | 0x19),
                        length.saturating_sub(1),
                    )
                }
            };
            if ends_round_trip {
                ROUND_TRIPS.fetch_add(1, Ordering::Relaxed);
            }
            self.rest = rest;
            self.header.clear();
        }
    }
}
