//! The collector of the telemetry rows: an OTLP/HTTP receiver that reads each export request
//! (keep-alive, `Content-Length` bodies), answers `200` with an empty protobuf body (an empty
//! `Export*ServiceResponse`: everything accepted) and keeps nothing, so the rows measure what
//! exporting costs toolhost and not what a collector does with the spans.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Starts the receiver on a free loopback port, on the current runtime; returns its base URL.
///
/// # Errors
/// No port could be bound.
pub async fn start() -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    Ok(format!("http://{address}"))
}

/// Answers every request of one connection until it closes.
async fn serve(mut stream: TcpStream) {
    let mut buffer: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // The head, then as many body bytes as it announces.
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_export_is_answered_on_one_connection() {
        let url = start().await.unwrap();
        let address = url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).await.unwrap();
        let request = b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc";
        let mut answers = String::new();
        for _ in 0..2 {
            stream.write_all(request).await.unwrap();
            let mut buffer = [0u8; 256];
            let n = stream.read(&mut buffer).await.unwrap();
            answers.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
        assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    }
}
