//! What the HTTP doors (the MCP door's `/mcp` and the console) do with the body of a request
//! they refuse before reading it.
//!
//! Answered before its body arrived, a request leaves its connection closed by hyper after the
//! answer (it will not read an unknown rest), and a client that reuses the connection at once,
//! as an OAuth client fetching the metadata a `401` names does, finds it closed without an
//! answer. So a refusal reads the body and drops it first, within bounds; past them the answer
//! says `Connection: close`, and the client knows not to reuse the connection.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;

/// How much of a refused request's body is read.
const LIMIT: u64 = 1024 * 1024;

/// How long a refused request's body is waited for.
const TIME: Duration = Duration::from_secs(2);

/// Reads and drops `body`, at most `limit` bytes of it; whether it read to the body's end.
pub(crate) async fn drain(body: Body, limit: u64) -> bool {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut read = 0u64;
    while read <= limit {
        match stream.next().await {
            Some(Ok(chunk)) => read += chunk.len() as u64,
            Some(Err(_)) => return false,
            None => return true,
        }
    }
    false
}

/// `response`, a refusal of the request whose `body` this is, sent once the body is read (or
/// marked `Connection: close` when it is too large or too slow to read).
pub(crate) async fn refuse(body: Body, mut response: Response) -> Response {
    if !tokio::time::timeout(TIME, drain(body, LIMIT)).await.unwrap_or(false) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};

    use axum::Router;
    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::middleware::{self, Next};
    use axum::response::IntoResponse as _;

    use super::*;

    /// Refuses every `POST`, answers `GET`s.
    async fn refuse_posts(request: Request, next: Next) -> Response {
        if request.method() == axum::http::Method::POST {
            return refuse(request.into_body(), StatusCode::UNAUTHORIZED.into_response()).await;
        }
        next.run(request).await
    }

    /// One response's status line and headers, and its body read by `Content-Length`.
    fn response(reader: &mut BufReader<std::net::TcpStream>) -> (String, Vec<String>) {
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            headers.push(line.trim_end().to_ascii_lowercase());
        }
        let length = headers
            .iter()
            .find_map(|line| line.strip_prefix("content-length: ")?.parse::<usize>().ok())
            .unwrap_or(0);
        reader.read_exact(&mut vec![0; length]).unwrap();
        (status, headers)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_request_whose_body_comes_late_leaves_its_connection_usable() {
        let router = Router::new()
            .route("/", axum::routing::get(|| async { "hello" }).post(|| async { "never" }))
            .layer(middleware::from_fn(refuse_posts));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, router).await });
        tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            // The body after the headers, in a later write.
            stream.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            stream.write_all(b"hello").unwrap();
            let (status, headers) = response(&mut reader);
            assert!(status.contains(" 401 "), "{status}");
            assert!(!headers.contains(&"connection: close".to_owned()), "{headers:?}");
            stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let (status, _) = response(&mut reader);
            assert!(status.contains(" 200 "), "the same connection after the refusal: {status}");
            // A body that never comes: the refusal is sent after the wait, saying the
            // connection closes.
            stream.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n").unwrap();
            let (status, headers) = response(&mut reader);
            assert!(status.contains(" 401 "), "{status}");
            assert!(headers.contains(&"connection: close".to_owned()), "{headers:?}");
        })
        .await
        .unwrap();
    }
}
