//! The shard rule of docs/CONTRACTS.md ("Sharded requests streams"), written again from the
//! contract (the bench depends on no workspace crate): the stream of shard k of N and the
//! shard of a request id. A third implementation beside the daemon's and the Python client's,
//! held to the same table.

use crate::envelope::REQUESTS_STREAM;

/// The characters shard tags are made of, in the order they are tried.
const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// CRC16/XMODEM, the cluster's key hash.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in bytes {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The n-th tag tried: n in bijective base 62, least significant character first.
fn candidate(mut n: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(ALPHABET[n % ALPHABET.len()]);
        n /= ALPHABET.len();
        if n == 0 {
            return String::from_utf8_lossy(&out).into_owned();
        }
        n -= 1;
    }
}

/// The stream of shard `k` of `count` (the requests stream itself for one shard).
pub fn stream(k: usize, count: usize) -> String {
    if count <= 1 {
        return REQUESTS_STREAM.to_owned();
    }
    let (lo, hi) = (k * 16384 / count, (k + 1) * 16384 / count);
    let quarter = (hi - lo) / 4;
    let tag = (0..)
        .map(candidate)
        .find(|tag| (lo + quarter..hi - quarter).contains(&usize::from(crc16(tag.as_bytes()) % 16384)))
        .unwrap_or_default();
    format!("{REQUESTS_STREAM}:{{{tag}}}")
}

/// The shard of request id `id` among `count`.
pub fn of(id: &str, count: usize) -> usize {
    usize::from(crc16(id.as_bytes())) % count.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_table() {
        let tags = |count: usize| -> Vec<String> {
            (0..count)
                .map(|k| {
                    stream(k, count).trim_start_matches("action-requests:{").trim_end_matches('}').to_owned()
                })
                .collect()
        };
        assert_eq!(tags(6), ["3", "j", "c", "1", "h", "a"]);
        assert_eq!(tags(8), ["e0", "b", "20", "c", "g0", "d", "00", "a"]);
        assert_eq!(stream(0, 1), "action-requests");
        assert_eq!(of("123456789", 6), 1);
    }
}
