//! `toolhost-bench-jwt`: what the MCP door's `[mcp.oauth]` check costs per call, with the
//! issuer's JWKS already kept.
//!
//! The bench depends on no workspace crate, so it does the door's two paths with the same
//! library and settings (`crates/daemon/src/doors/mcp/oauth.rs`):
//!
//! 1. **a token seen for the first time**: `decode_header`, then `decode` with the door's
//!    `Validation` (RS256, `iss`, `aud`, `exp` and `nbf` with 60 s of leeway, `exp`/`iss`/`aud`
//!    required) against a `DecodingKey` made from the JWK's `n` and `e`, as the door makes it,
//!    then the scope and tenant claims read;
//! 2. **a token that already passed**: its SHA-256, then the lookup in the map of passed
//!    tokens (4096 entries) and the grant cloned, which is what every later call of the same
//!    client costs.
//!
//! The key is a 2048-bit RSA key made by `openssl genrsa` (RS256 is what most issuers sign
//! with). Each path runs for a warm-up, then each operation is timed on its own (p50, p99) and
//! the whole loop once (mean). The table goes to stdout and `target/bench/jwt.md`.
//!
//! ```text
//! cargo build --profile dist -p toolhost-bench && target/dist/toolhost-bench-jwt
//! ```

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use base64::Engine as _;
use hdrhistogram::Histogram;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Value, json};
use sha2::Digest as _;

/// First-sight checks timed.
const VERIFIES: usize = 5_000;
/// Remembered-token checks timed.
const LOOKUPS: usize = 500_000;
/// Passed tokens in the door's map, as a busy door holds them.
const REMEMBERED: usize = 4096;

/// The door's grant: who, and for which tenant.
#[derive(Clone)]
struct Grant {
    _subject: String,
    _tenant: String,
}

fn openssl(args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let output = Command::new("openssl").args(args).output().context("run openssl")?;
    anyhow::ensure!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(output.stdout)
}

fn hex_bytes(hex: &str) -> anyhow::Result<Vec<u8>> {
    (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(&hex[at..at + 2], 16).context("hex")).collect()
}

fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("toolhost-bench-jwt-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let pem = dir.join("key.pem");
    let pem = pem.to_str().context("a UTF-8 temp path")?;
    openssl(&["genrsa", "-traditional", "-out", pem, "2048"])?;
    let der = openssl(&["rsa", "-in", pem, "-outform", "DER", "-traditional"])?;
    let modulus = String::from_utf8(openssl(&["rsa", "-in", pem, "-noout", "-modulus"])?)?;
    let _ = std::fs::remove_dir_all(&dir);
    let modulus = modulus.trim().strip_prefix("Modulus=").context("openssl's modulus")?;
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hex_bytes(modulus)?);

    let issuer = "https://auth.example.com";
    let resource = "https://tools.example.com/mcp";
    let now = jsonwebtoken::get_current_timestamp();
    let claims = json!({"iss": issuer, "sub": "agent-acme", "aud": resource, "iat": now, "nbf": now,
        "exp": now + 3600, "scope": "tools:call", "org": "acme"});
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("key-1".to_owned());
    let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_der(&der))?;
    let key = DecodingKey::from_rsa_components(&n, "AQAB")?;
    let mut keys = HashMap::new();
    keys.insert("key-1".to_owned(), key);

    let first_sight = || -> anyhow::Result<Grant> {
        let header = jsonwebtoken::decode_header(&token)?;
        let key = keys.get(header.kid.as_deref().unwrap_or_default()).context("the kid")?.clone();
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = 60;
        let claims = jsonwebtoken::decode::<Value>(&token, &key, &validation)?.claims;
        let scope = claims["scope"].as_str().unwrap_or_default();
        anyhow::ensure!(scope.split_whitespace().any(|scope| scope == "tools:call"), "the scope");
        Ok(Grant {
            _subject: claims["sub"].as_str().unwrap_or("-").to_owned(),
            _tenant: claims["org"].as_str().context("the tenant")?.to_owned(),
        })
    };

    let mut passed: HashMap<[u8; 32], (Grant, u64)> = HashMap::new();
    for other in 0..REMEMBERED - 1 {
        let digest: [u8; 32] = sha2::Sha256::digest(format!("other token {other}").as_bytes()).into();
        passed.insert(digest, (Grant { _subject: "x".to_owned(), _tenant: "y".to_owned() }, now + 3600));
    }
    let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
    passed.insert(digest, (first_sight()?, now + 3600));
    let remembered = || -> Option<Grant> {
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = jsonwebtoken::get_current_timestamp();
        passed.get(&digest).filter(|(_, expires)| now <= expires + 60).map(|(grant, _)| grant.clone())
    };

    let mut rows = Vec::new();
    for (name, count, run) in [
        (
            "a token seen for the first time (RS256 verify and claims)",
            VERIFIES,
            &(|| first_sight().map(|_| ())) as &dyn Fn() -> anyhow::Result<()>,
        ),
        (
            "a token that already passed (SHA-256 and lookup)",
            LOOKUPS,
            &(|| remembered().map(|_| ()).context("remembered")) as &dyn Fn() -> anyhow::Result<()>,
        ),
    ] {
        for _ in 0..count / 10 {
            run()?;
        }
        let mut histogram = Histogram::<u64>::new(3)?;
        for _ in 0..count {
            let started = Instant::now();
            run()?;
            histogram.record(started.elapsed().as_nanos() as u64)?;
        }
        let started = Instant::now();
        for _ in 0..count {
            run()?;
        }
        let mean = started.elapsed().as_nanos() as f64 / count as f64;
        rows.push(format!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            histogram.value_at_quantile(0.5) as f64 / 1000.0,
            histogram.value_at_quantile(0.99) as f64 / 1000.0,
            mean / 1000.0
        ));
    }
    let table = format!(
        "| the door's check of a JWT (RS256, 2048-bit key, JWKS kept) | p50 µs | p99 µs | mean µs |\n|---|---:|---:|---:|\n{}\n",
        rows.join("\n")
    );
    print!("{table}");
    std::fs::create_dir_all("target/bench")?;
    std::fs::write("target/bench/jwt.md", &table)?;
    Ok(())
}
