//! Raw HTTP/1.1 requests to the daemon's HTTP listeners (an MCP door's `/mcp`, the console), as
//! a client with no SDK sends them.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// One raw HTTP/1.1 request to the door; the status code and body.
pub fn raw(port: u16, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the door");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set a read timeout");
    stream.write_all(request.as_bytes()).expect("send the request");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    (status, text)
}

/// A JSON-RPC POST to `/mcp` with extra `headers` (each ending in CRLF).
pub fn post(port: u16, headers: &str, body: &str) -> (u16, String) {
    raw(
        port,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The `Mcp-Session-Id` of a response, empty when it has none.
pub fn session_id(response: &str) -> String {
    response
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| line[15..].trim().to_owned())
        })
        .unwrap_or_default()
}
