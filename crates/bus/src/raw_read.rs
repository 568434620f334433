//! Group reads on a connection of their own that cut large values as they arrive.
//!
//! A plain `XREADGROUP ... COUNT n` would hold every entry of the reply whole, whatever its size,
//! so reads on a client that buffers replies whole go through a Lua script that cuts values on
//! the server (`scripts/read_group.lua`). That script costs Redis about three microseconds per
//! entry to copy every entry into Lua and back. This reader sends the plain command instead, on a
//! TCP (plain or TLS) or Unix connection it owns, and reads the reply as a stream: a value longer than the
//! limit is never held whole, only its first [`DEFECT_HEAD_BYTES`] are kept while the rest is
//! hashed (SHA-1, as `redis.sha1hex` would) and dropped. So one read costs Redis what the plain
//! command costs, and holds no more memory than the script's reply would.
//!
//! The connection speaks RESP2 (no `HELLO`), authenticates and selects the database of the URL,
//! and is used by one read at a time; any I/O error or protocol surprise drops it. Over TLS it
//! trusts what redis-rs trusts for the same URL and [`Tls`] (`crate::tls`), so the reader and the
//! rest of the bus accept the same servers, and an untrusted server fails the same way
//! ([`Error::Tls`]).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_rustls::TlsConnector;
use toolhost_envelope::{DEFECT_HEAD_BYTES, Entry};

use crate::error::Cause;
use crate::{Error, Tls};

/// The longest status, error or length line accepted; anything longer is not Redis talking.
const MAX_LINE: usize = 64 * 1024;
/// Most array items allocated for up front, whatever length the header claims.
const MAX_PREALLOCATED: usize = 1024;

/// A master's slots in a `CLUSTER SLOTS` reply: first slot, last slot, and its host and port
/// (`None` when the cluster does not know its address, `?`).
pub(crate) type SlotRange = (u16, u16, Option<(String, u16)>);

/// Where and how the reader's connections are made.
#[derive(Debug, Clone)]
pub(crate) struct RawTarget {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

#[derive(Clone)]
enum Addr {
    Tcp(String, u16),
    /// TCP with TLS: the name the server's certificate must carry, and the client setup.
    Tls {
        host: String,
        port: u16,
        name: ServerName<'static>,
        connector: TlsConnector,
    },
    Unix(PathBuf),
}

/// The connector holds no secret worth printing and has no `Debug` of its own.
impl std::fmt::Debug for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(host, port) => write!(f, "tcp {host}:{port}"),
            Addr::Tls { host, port, .. } => write!(f, "tls {host}:{port}"),
            Addr::Unix(path) => write!(f, "unix {}", path.display()),
        }
    }
}

impl RawTarget {
    /// The target of `url` when this reader can reach it: a TCP (plain or TLS, with `tls`'s CA
    /// and client certificate) or Unix socket URL; `None` for what it cannot reach, whose reads
    /// keep going through the script.
    ///
    /// # Errors
    /// The URL is TLS and its server name or `tls` cannot be used.
    pub(crate) fn of(url: &str, tls: &Tls) -> Result<Option<RawTarget>, Error> {
        let Ok(info): Result<ConnectionInfo, _> = url.into_connection_info() else { return Ok(None) };
        let addr = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            ConnectionAddr::TcpTls { host, port, insecure, .. } => {
                let config = tls.client_config(*insecure).map_err(Error::Tls)?;
                Addr::Tls {
                    host: host.clone(),
                    port: *port,
                    name: crate::tls::server_name(host).map_err(Error::Tls)?,
                    connector: TlsConnector::from(Arc::clone(&config)),
                }
            }
            ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return Ok(None),
        };
        let settings = info.redis_settings();
        Ok(Some(RawTarget {
            addr,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        }))
    }

    /// The host this target connects to (empty for a Unix socket).
    pub(crate) fn host(&self) -> &str {
        match &self.addr {
            Addr::Tcp(host, _) | Addr::Tls { host, .. } => host,
            Addr::Unix(_) => "",
        }
    }

    /// A new connection, authenticated and on the URL's database, within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<RawReader, Error> {
        let unavailable = |err: io::Error| io_failure("reader connection", &err);
        let connecting = async {
            let stream: Box<dyn Stream> = match &self.addr {
                Addr::Tcp(host, port) => {
                    let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    stream.set_nodelay(true)?;
                    Box::new(stream)
                }
                Addr::Tls { host, port, name, connector } => {
                    let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    stream.set_nodelay(true)?;
                    Box::new(connector.connect(name.clone(), stream).await?)
                }
                Addr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
            };
            io::Result::Ok(RawReader { stream: BufReader::new(stream), line: Vec::new() })
        };
        let mut reader = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_elapsed| unavailable(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))?
            .map_err(unavailable)?;
        if let Some(password) = &self.password {
            let mut auth = vec!["AUTH".as_bytes()];
            if let Some(username) = &self.username {
                auth.push(username.as_bytes());
            }
            auth.push(password.as_bytes());
            reader.command_ok(&auth, timeout).await?;
        }
        if self.db != 0 {
            let db = self.db.to_string();
            reader.command_ok(&[b"SELECT", db.as_bytes()], timeout).await?;
        }
        Ok(reader)
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Stream for S {}

/// One connection for group reads.
pub(crate) struct RawReader {
    stream: BufReader<Box<dyn Stream>>,
    /// The header line being read.
    line: Vec<u8>,
}

/// How a read failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Redis answered with an error; the connection is still in step and can be reused.
    Reply(Error),
    /// The connection failed or said something unexpected; drop it.
    Broken(Error),
}

/// What one header line starts.
enum Token {
    /// A whole value.
    Value(Reply),
    /// A non-empty array of this many items, which follow.
    Array(usize),
}

/// One value of a reply, with long bulk strings already cut.
#[derive(Debug, PartialEq)]
enum Reply {
    Nil,
    Int(i64),
    Status(String),
    Error(String),
    Bulk(Vec<u8>),
    /// A bulk string longer than the limit: its head, full size and SHA-1 (hex).
    Cut {
        head: Vec<u8>,
        size: u64,
        sha1: String,
    },
    Array(Vec<Reply>),
}

impl RawReader {
    /// Reads up to `count` new entries of `topic` for `consumer` of `group`, waiting up to
    /// `block` for the first (not at all when zero); values longer than `limit` arrive cut.
    pub(crate) async fn read_group(
        &mut self,
        topic: &str,
        group: &str,
        consumer: &str,
        count: usize,
        block: Duration,
        limit: usize,
    ) -> Result<Vec<Entry>, ReadError> {
        let count = count.to_string();
        let millis = block.as_millis().to_string();
        let mut args: Vec<&[u8]> =
            vec![b"XREADGROUP", b"GROUP", group.as_bytes(), consumer.as_bytes(), b"COUNT", count.as_bytes()];
        if !block.is_zero() {
            args.extend([b"BLOCK".as_slice(), millis.as_bytes()]);
        }
        args.extend([b"STREAMS".as_slice(), topic.as_bytes(), b">"]);
        let broken = |err: io::Error| ReadError::Broken(io_failure("group read", &err));
        self.send(&args).await.map_err(broken)?;
        match self.reply(limit).await.map_err(broken)? {
            Reply::Error(message) => {
                let cause = Cause::parse(&message);
                Err(ReadError::Reply(match cause.code() {
                    Some("NOGROUP") => Error::NoGroup(cause),
                    _ => Error::from_cause(cause),
                }))
            }
            reply => entries(reply, limit)
                .ok_or_else(|| ReadError::Broken(Error::Protocol("malformed XREADGROUP reply".to_owned()))),
        }
    }

    /// The masters' slot ranges, as this node sees them (`CLUSTER SLOTS`), within `timeout`; a
    /// master announced without a host (empty or nil: "the node you asked") gets `host`, this
    /// connection's.
    ///
    /// # Errors
    /// The node refused the command ([`Error::Refused`] when it never will: not a cluster, no
    /// permission), the connection failed, or the reply is not one.
    pub(crate) async fn cluster_slots(
        &mut self,
        host: &str,
        timeout: Duration,
    ) -> Result<Vec<SlotRange>, Error> {
        let exchange = async {
            self.send(&[b"CLUSTER", b"SLOTS"]).await?;
            self.reply(MAX_LINE).await
        };
        let reply = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(Reply::Error(message))) => return Err(Error::from_cause(Cause::parse(&message))),
            Ok(Ok(reply)) => reply,
            Ok(Err(err)) => return Err(io_failure("CLUSTER SLOTS", &err)),
            Err(_elapsed) => {
                return Err(Error::Unavailable(Cause::other("CLUSTER SLOTS: no answer in time")));
            }
        };
        slot_ranges(reply, host).ok_or_else(|| Error::Protocol("malformed CLUSTER SLOTS reply".to_owned()))
    }

    /// Sends a command that must answer `+OK`.
    async fn command_ok(&mut self, args: &[&[u8]], timeout: Duration) -> Result<(), Error> {
        let exchange = async {
            self.send(args).await?;
            self.reply(MAX_LINE).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(Reply::Status(_))) => Ok(()),
            Ok(Ok(Reply::Error(message))) => Err(Error::from_cause(Cause::parse(&message))),
            Ok(Ok(other)) => {
                Err(Error::Protocol(format!("unexpected reply to {:?}: {other:?}", args.first())))
            }
            Ok(Err(err)) => Err(io_failure("reader connection", &err)),
            Err(_elapsed) => Err(Error::Unavailable(Cause::other("reader connection: no answer in time"))),
        }
    }

    async fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        use std::io::Write as _;
        let mut out = Vec::with_capacity(16 + args.iter().map(|arg| arg.len() + 16).sum::<usize>());
        // Writing into a Vec cannot fail.
        let _ = write!(out, "*{}\r\n", args.len());
        for arg in args {
            let _ = write!(out, "${}\r\n", arg.len());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        let stream = self.stream.get_mut();
        stream.write_all(&out).await?;
        stream.flush().await
    }

    /// Reads one whole reply, arrays included, cutting bulk strings longer than `limit`.
    async fn reply(&mut self, limit: usize) -> io::Result<Reply> {
        // Arrays being filled: their items so far and how many are still to come.
        let mut open: Vec<(Vec<Reply>, usize)> = Vec::new();
        loop {
            let mut value = match self.token(limit).await? {
                Token::Array(length) => {
                    open.push((Vec::with_capacity(length.min(MAX_PREALLOCATED)), length));
                    continue;
                }
                Token::Value(value) => value,
            };
            // Hand the value to the innermost open array, closing every array it completes.
            loop {
                let Some((items, left)) = open.last_mut() else { return Ok(value) };
                items.push(value);
                *left -= 1;
                if *left > 0 {
                    break;
                }
                let (items, _) = open.pop().unwrap_or_default();
                value = Reply::Array(items);
            }
        }
    }

    /// Reads one value, or the header of a non-empty array whose items follow.
    async fn token(&mut self, limit: usize) -> io::Result<Token> {
        // The line's buffer is kept across lines, so reading a reply allocates only its values.
        let mut line = std::mem::take(&mut self.line);
        let token = self.token_of_line(&mut line, limit).await;
        self.line = line;
        token
    }

    async fn token_of_line(&mut self, line: &mut Vec<u8>, limit: usize) -> io::Result<Token> {
        self.read_line(line).await?;
        let (kind, rest) = line.split_first().ok_or_else(|| bad("empty line"))?;
        let text = || String::from_utf8_lossy(rest).into_owned();
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest).ok().and_then(|text| text.parse().ok()).ok_or_else(|| bad("bad number"))
        };
        Ok(Token::Value(match kind {
            b'+' => Reply::Status(text()),
            b'-' => Reply::Error(text()),
            b':' => Reply::Int(number()?),
            b'$' => match usize::try_from(number()?) {
                Err(_) => Reply::Nil,
                Ok(size) => self.bulk(size, limit).await?,
            },
            b'*' => match usize::try_from(number()?) {
                Err(_) => Reply::Nil,
                Ok(0) => Reply::Array(Vec::new()),
                Ok(length) => return Ok(Token::Array(length)),
            },
            _ => return Err(bad("unknown reply type")),
        }))
    }

    /// One line without its CRLF, into `line`.
    async fn read_line(&mut self, line: &mut Vec<u8>) -> io::Result<()> {
        line.clear();
        loop {
            let available = self.stream.fill_buf().await?;
            if available.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
            }
            let end = available.iter().position(|&byte| byte == b'\n');
            let taken = end.unwrap_or(available.len());
            line.extend_from_slice(&available[..taken]);
            self.stream.consume(taken + usize::from(end.is_some()));
            // Checked whether or not the line ended in this chunk, so the bound does not depend
            // on how the bytes arrived.
            if line.len() > MAX_LINE + 1 {
                return Err(bad("line too long"));
            }
            if end.is_some() {
                break;
            }
        }
        if line.pop() != Some(b'\r') {
            return Err(bad("line without CR"));
        }
        Ok(())
    }

    /// A bulk string of `size` bytes and its CRLF: whole up to `limit`, else cut as it streams.
    async fn bulk(&mut self, size: usize, limit: usize) -> io::Result<Reply> {
        let keep = if size > limit { DEFECT_HEAD_BYTES.min(size) } else { size };
        let mut kept = Vec::with_capacity(keep);
        let mut digest = (size > limit).then(sha1_smol::Sha1::new);
        let mut left = size;
        while left > 0 {
            let available = self.stream.fill_buf().await?;
            if available.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
            }
            let chunk = &available[..available.len().min(left)];
            let room = keep - kept.len();
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if let Some(digest) = &mut digest {
                digest.update(chunk);
            }
            let taken = chunk.len();
            self.stream.consume(taken);
            left -= taken;
        }
        let mut crlf = [0u8; 2];
        tokio::io::AsyncReadExt::read_exact(&mut self.stream, &mut crlf).await?;
        if crlf != *b"\r\n" {
            return Err(bad("bulk string without CRLF"));
        }
        Ok(match digest {
            Some(digest) => Reply::Cut { head: kept, size: size as u64, sha1: digest.digest().to_string() },
            None => Reply::Bulk(kept),
        })
    }
}

/// The error of a failed exchange: [`Error::Tls`] when TLS failed for good (a certificate the
/// server refused arrives as an alert on the first read), else the connection is unavailable.
fn io_failure(context: &str, err: &io::Error) -> Error {
    match crate::tls::problem(err) {
        Some(problem) => Error::Tls(problem),
        None => Error::Unavailable(Cause::other(format!("{context}: {err}"))),
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("protocol error: {what}"))
}

/// The masters' ranges of a `CLUSTER SLOTS` reply (`[[first, last, [host, port, id, ...],
/// replicas...], ...]`), an empty or nil host read as `host`. `None` when the shape is wrong.
fn slot_ranges(reply: Reply, host: &str) -> Option<Vec<SlotRange>> {
    let Reply::Array(ranges) = reply else { return None };
    let mut res = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Reply::Array(parts) = range else { return None };
        let mut parts = parts.into_iter();
        let (Some(Reply::Int(first)), Some(Reply::Int(last)), Some(Reply::Array(master))) =
            (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let mut master = master.into_iter();
        let announced = match master.next()? {
            Reply::Bulk(announced) => String::from_utf8(announced).ok()?,
            Reply::Nil => String::new(),
            _ => return None,
        };
        let Some(Reply::Int(port)) = master.next() else { return None };
        let address = match announced.as_str() {
            "?" => None,
            "" => Some((host.to_owned(), u16::try_from(port).ok()?)),
            _ => Some((announced, u16::try_from(port).ok()?)),
        };
        res.push((u16::try_from(first).ok()?, u16::try_from(last).ok()?, address));
    }
    Some(res)
}

/// The entries of an `XREADGROUP` reply (`nil` when the read timed out): `[[stream, [[id,
/// [field, value, ...]], ...]]]`. `None` when the shape is wrong.
fn entries(reply: Reply, limit: usize) -> Option<Vec<Entry>> {
    let streams = match reply {
        Reply::Nil => return Some(Vec::new()),
        Reply::Array(streams) => streams,
        _ => return None,
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Reply::Array(parts) = stream else { return None };
        let Some(Reply::Array(items)) = parts.into_iter().nth(1) else { return None };
        entries.reserve(items.len());
        for item in items {
            let Reply::Array(parts) = item else { return None };
            let mut parts = parts.into_iter();
            let Some(Reply::Bulk(entry_id)) = parts.next() else { return None };
            let mut pairs = Vec::with_capacity(2);
            let mut cuts = Vec::new();
            match parts.next() {
                // An entry deleted while pending has no fields.
                None | Some(Reply::Nil) => {}
                Some(Reply::Array(fields)) => {
                    let mut fields = fields.into_iter();
                    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                        let Reply::Bulk(name) = name else { return None };
                        let value = match value {
                            Reply::Bulk(value) => value,
                            Reply::Cut { head, size, sha1 } => {
                                cuts.push((name.clone(), size, sha1));
                                head
                            }
                            _ => return None,
                        };
                        pairs.push((name, value));
                    }
                }
                Some(_) => return None,
            }
            entries.push(entry_with_cuts(&String::from_utf8_lossy(&entry_id), pairs, cuts, limit));
        }
    }
    Some(entries)
}

/// One entry from its fields as read (a cut value as its head) and the values that were cut, as
/// `(field, full size, SHA-1)`, whether the server cut them (the read and reclaim scripts) or
/// this reader did.
pub(crate) fn entry_with_cuts(
    entry_id: &str,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    mut cuts: Vec<(Vec<u8>, u64, String)>,
    limit: usize,
) -> Entry {
    let cut_of = |name: &[u8]| {
        cuts.iter().position(|(cut, _, _)| cut.as_slice() == name).map(|at| {
            let (_, size, sha1) = cuts.swap_remove(at);
            (size, sha1)
        })
    };
    Entry::from_raw_fields(entry_id, pairs, limit, cut_of)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A failed unwrap is a failed test, which is what we want.
mod tests {
    use super::*;

    /// A reader over canned server bytes, written in `chunk`-byte pieces.
    fn reader(bytes: &[u8], chunk: usize) -> RawReader {
        let (client, mut server) = tokio::io::duplex(chunk.max(1));
        let bytes = bytes.to_vec();
        tokio::spawn(async move {
            for piece in bytes.chunks(chunk.max(1)) {
                if server.write_all(piece).await.is_err() {
                    return;
                }
            }
            // Then end of file, which only a reply cut short runs into.
            let _ = server.shutdown().await;
        });
        RawReader { stream: BufReader::with_capacity(chunk.max(1), Box::new(client)), line: Vec::new() }
    }

    fn bulk(bytes: &[u8]) -> Vec<u8> {
        let mut out = format!("${}\r\n", bytes.len()).into_bytes();
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
        out
    }

    /// An entry as the server sends it: its id and its fields.
    type RawEntry<'a> = (&'a str, Vec<(&'a str, Vec<u8>)>);

    fn read_reply(entries: &[RawEntry<'_>]) -> Vec<u8> {
        let mut out = format!("*1\r\n*2\r\n{}*{}\r\n", String::from_utf8(bulk(b"s")).unwrap(), entries.len())
            .into_bytes();
        for (id, fields) in entries {
            out.extend_from_slice(b"*2\r\n");
            out.extend(bulk(id.as_bytes()));
            out.extend_from_slice(format!("*{}\r\n", fields.len() * 2).as_bytes());
            for (name, value) in fields {
                out.extend(bulk(name.as_bytes()));
                out.extend(bulk(value));
            }
        }
        out
    }

    #[tokio::test]
    async fn nested_replies_are_read_whole_in_any_chunking() {
        let bytes = b"*3\r\n:7\r\n*2\r\n$2\r\nab\r\n*0\r\n$-1\r\n";
        for chunk in [1, 2, 3, 7, 64] {
            let reply = reader(bytes, chunk).reply(1024).await.unwrap();
            assert_eq!(
                reply,
                Reply::Array(vec![
                    Reply::Int(7),
                    Reply::Array(vec![Reply::Bulk(b"ab".to_vec()), Reply::Array(Vec::new())]),
                    Reply::Nil,
                ]),
                "chunk {chunk}"
            );
        }
        assert_eq!(
            reader(b"-NOGROUP no group\r\n", 4).reply(8).await.unwrap(),
            Reply::Error("NOGROUP no group".into())
        );
        assert_eq!(reader(b"*-1\r\n", 4).reply(8).await.unwrap(), Reply::Nil);
    }

    #[tokio::test]
    async fn values_over_the_limit_keep_their_head_size_and_digest_and_no_more() {
        let large = vec![b'z'; DEFECT_HEAD_BYTES * 3 + 5];
        let bytes = read_reply(&[
            ("1-1", vec![("id", b"m-1".to_vec()), ("payload", b"{}".to_vec())]),
            ("1-2", vec![("id", b"m-2".to_vec()), ("payload", large.clone())]),
            ("1-3", vec![("id", b"m-3".to_vec()), ("payload", b"\xff".to_vec())]),
        ]);
        for chunk in [5, 4096] {
            let mut reader = reader(&bytes, chunk);
            let reply = reader.reply(1024).await.unwrap();
            let entries = entries(reply, 1024).unwrap();
            let ids: Vec<&str> = entries.iter().map(|entry| entry.id.as_str()).collect();
            assert_eq!(ids, ["m-1", "m-2", "m-3"]);
            assert_eq!(entries[0].payload.as_deref(), Some("{}"));
            let cut = entries[1].defect.as_ref().unwrap();
            assert_eq!((cut.head.len(), cut.size), (DEFECT_HEAD_BYTES, large.len() as u64));
            assert_eq!(cut.sha1, sha1_smol::Sha1::from(&large).digest().to_string());
            assert!(entries[2].defect.is_some());
            assert_eq!(entries[1].entry_id, "1-2");
        }
    }

    #[tokio::test]
    async fn cluster_slots_name_each_masters_range_and_address() {
        let node = |host: &[u8], port: i64| {
            let mut out = b"*3\r\n".to_vec();
            out.extend(bulk(host));
            out.extend(format!(":{port}\r\n").into_bytes());
            out.extend(bulk(b"id"));
            out
        };
        let mut bytes = b"*3\r\n".to_vec();
        for (first, last, host, port) in
            [(0, 5460, "10.0.0.1", 7000), (5461, 10922, "", 7001), (10923, 16383, "?", 7002)]
        {
            bytes.extend(format!("*4\r\n:{first}\r\n:{last}\r\n").into_bytes());
            bytes.extend(node(host.as_bytes(), port));
            bytes.extend(node(b"10.0.0.9", port + 100));
        }
        let reply = reader(&bytes, 7).reply(MAX_LINE).await.unwrap();
        assert_eq!(
            slot_ranges(reply, "seed").unwrap(),
            [
                (0, 5460, Some(("10.0.0.1".to_owned(), 7000))),
                (5461, 10922, Some(("seed".to_owned(), 7001))),
                (10923, 16383, None),
            ]
        );
        assert!(slot_ranges(Reply::Array(vec![Reply::Int(1)]), "seed").is_none());
        assert!(slot_ranges(Reply::Nil, "seed").is_none());
    }

    #[tokio::test]
    async fn a_timed_out_read_is_no_entries_and_garbage_is_an_error() {
        assert!(entries(reader(b"*-1\r\n", 8).reply(8).await.unwrap(), 8).unwrap().is_empty());
        assert!(reader(b"?what\r\n", 8).reply(8).await.is_err());
        assert!(reader(b"$3\r\nabcXY", 8).reply(8).await.is_err());
        assert!(reader(b":12", 8).reply(8).await.is_err(), "EOF inside a line");
        assert!(entries(Reply::Int(1), 8).is_none());
    }

    #[tokio::test]
    async fn headers_that_claim_more_than_comes_allocate_no_more_than_their_bounds() {
        // A length the stream never delivers: only the bounded head or first items are set aside
        // (a terabyte-sized buffer would abort the process), and the early end is an error.
        assert!(reader(b"$999999999999\r\nabc", 64).reply(8).await.is_err());
        assert!(reader(b"*999999999999\r\n:1\r\n", 64).reply(8).await.is_err());
        // A header line without end is given up past MAX_LINE, not buffered whole.
        let mut endless = vec![b'+'; MAX_LINE + 10];
        endless.extend_from_slice(b"\r\n");
        let err = reader(&endless, 4096).reply(8).await.unwrap_err();
        assert!(err.to_string().contains("line too long"), "{err}");
    }
}
