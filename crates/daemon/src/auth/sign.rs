//! Signed requests: `sig` = `v1=<key id>:<hex HMAC-SHA256(secret, the exact payload bytes)>`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The scheme prefix of a signature.
pub(crate) const SCHEME: &str = "v1=";
/// The longest `sig` value read: the scheme, a 64-character key id, `:` and 64 hex digits, with
/// room to spare. A longer value is refused before it is parsed.
pub(crate) const MAX_SIG_LEN: usize = 160;

type HmacSha256 = Hmac<Sha256>;

/// One signing key: its id and the HMAC keyed with its secret (the key schedule done once).
#[derive(Clone)]
pub(crate) struct SigningKey {
    id: String,
    mac: HmacSha256,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("SigningKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The key `id` with `secret`.
    pub(crate) fn new(id: &str, secret: &[u8]) -> SigningKey {
        // HMAC takes a key of any length.
        let mac = HmacSha256::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
        SigningKey { id: id.to_owned(), mac }
    }

    /// The `sig` field of `payload`.
    pub(crate) fn sign(&self, payload: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(payload);
        let digest = mac.finalize().into_bytes();
        let mut sig = String::with_capacity(SCHEME.len() + self.id.len() + 1 + 64);
        sig.push_str(SCHEME);
        sig.push_str(&self.id);
        sig.push(':');
        for byte in digest {
            sig.push(char::from(HEX[usize::from(byte >> 4)]));
            sig.push(char::from(HEX[usize::from(byte & 15)]));
        }
        sig
    }

    /// Whether `mac` is the HMAC of `payload` under this key, compared in constant time.
    pub(crate) fn verifies(&self, payload: &[u8], mac: &[u8; 32]) -> bool {
        let mut check = self.mac.clone();
        check.update(payload);
        check.verify_slice(mac).is_ok()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A `sig` value taken apart: the key id and the 32 bytes of the MAC.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Parsed<'a> {
    pub key_id: &'a str,
    pub mac: [u8; 32],
}

/// Takes a `sig` value apart, or says why it cannot be.
pub(crate) fn parse(sig: &str) -> Result<Parsed<'_>, &'static str> {
    if sig.len() > MAX_SIG_LEN {
        return Err("the sig field is longer than any signature");
    }
    let Some(rest) = sig.strip_prefix(SCHEME) else {
        return Err("the sig field is not a v1 signature (v1=<key id>:<hex HMAC-SHA256>)");
    };
    let Some((key_id, hex)) = rest.rsplit_once(':') else {
        return Err("the sig field has no ':' between the key id and the HMAC");
    };
    if key_id.is_empty() {
        return Err("the sig field names no key id");
    }
    let mut mac = [0u8; 32];
    let digits = hex.as_bytes();
    if digits.len() != 64 {
        return Err("the HMAC of the sig field is not 64 hex digits");
    }
    for (byte, pair) in mac.iter_mut().zip(digits.chunks_exact(2)) {
        let (Some(high), Some(low)) = (nibble(pair[0]), nibble(pair[1])) else {
            return Err("the HMAC of the sig field is not 64 hex digits");
        };
        *byte = high << 4 | low;
    }
    Ok(Parsed { key_id, mac })
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_rfc_4231_hmac_of_the_payload() {
        // RFC 4231, test case 2.
        let key = SigningKey::new("k", b"Jefe");
        let sig = key.sign(b"what do ya want for nothing?");
        assert_eq!(sig, "v1=k:5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        let parsed = parse(&sig).unwrap();
        assert_eq!(parsed.key_id, "k");
        assert!(key.verifies(b"what do ya want for nothing?", &parsed.mac));
        assert!(!key.verifies(b"what do ya want for nothing!", &parsed.mac));
        assert!(!SigningKey::new("k", b"Jeff").verifies(b"what do ya want for nothing?", &parsed.mac));
        // Upper-case hex reads the same.
        assert_eq!(parse(&sig.to_uppercase().replacen("V1=K", "v1=k", 1)).unwrap().mac, parsed.mac);
    }

    #[test]
    fn malformed_signatures_say_why() {
        let hex = "ab".repeat(32);
        for (sig, why) in [
            (format!("v2=k:{hex}"), "not a v1 signature"),
            (format!("k:{hex}"), "not a v1 signature"),
            (format!("v1=k{hex}"), "no ':'"),
            (format!("v1=:{hex}"), "no key id"),
            ("v1=k:abcd".to_owned(), "64 hex digits"),
            (format!("v1=k:{}zz", &hex[2..]), "64 hex digits"),
            (format!("v1=k:{hex}00"), "64 hex digits"),
            (format!("v1={}:{hex}", "k".repeat(200)), "longer than any signature"),
            (String::new(), "not a v1 signature"),
        ] {
            let err = parse(&sig).unwrap_err();
            assert!(err.contains(why), "{sig}: {err}");
        }
        // A key id may hold ':' only before the last one.
        assert_eq!(parse(&format!("v1=a:b:{hex}")).unwrap().key_id, "a:b");
    }
}
