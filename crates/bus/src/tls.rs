//! TLS to Redis with the operator's own CA and, for mutual TLS, a client certificate.
//!
//! [`Tls`] holds the PEM the daemon read from `[redis] ca_file`, `client_cert_file` and
//! `client_key_file`, checked when it is made (so a bad file stops start-up, not the first
//! connection). It is handed to redis-rs as [`redis::TlsCertificates`] for the main connection,
//! the cluster nodes, the sentinels and the master they name, and turned into a rustls
//! [`ClientConfig`] of the same make for the streaming group reader (`raw_read`), which speaks
//! TLS itself: the roots are the CA file when one is given, else the Mozilla roots redis-rs
//! trusts; `#insecure` on the URL skips verification in both.
//!
//! [`problem`] finds, in an error's sources, a TLS failure that retrying will not mend (a
//! certificate not trusted, a client certificate refused, a server that does not speak TLS) and
//! says it in words an operator can act on; the bus reports it as [`crate::Error::Tls`].

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore};

/// The certificates of TLS to Redis: a CA to trust instead of the Mozilla roots, and a client
/// certificate with its key. Both optional; the empty value changes nothing.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// PEM of the CA certificates the servers' certificates must chain to.
    ca: Option<Vec<u8>>,
    /// PEM of the client certificate chain and of its private key.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Never prints the key.
impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(|_| "<pem>"))
            .field("identity", &self.identity.as_ref().map(|_| "<pem, key redacted>"))
            .finish()
    }
}

impl Tls {
    /// TLS settings from PEM: `ca`, CA certificates to trust; `identity`, a client certificate
    /// chain and its private key.
    ///
    /// # Errors
    /// A PEM holds no certificate or key, cannot be parsed, or the key does not belong to the
    /// certificate; the message says which.
    pub fn new(ca: Option<Vec<u8>>, identity: Option<(Vec<u8>, Vec<u8>)>) -> Result<Tls, String> {
        let tls = Tls { ca, identity };
        if let Some(ca) = &tls.ca {
            let count = roots(ca)?.len();
            if count == 0 {
                return Err("the CA file holds no PEM certificate".to_owned());
            }
        }
        if let Some((cert, key)) = &tls.identity {
            client_identity(cert, key)?;
        }
        // Building the config checks what parsing cannot, such as a key of another certificate.
        tls.client_config(false)?;
        Ok(tls)
    }

    /// Whether nothing is set: redis-rs's defaults apply.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }

    /// These settings for redis-rs; `None` when empty.
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.is_empty() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self.identity.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        })
    }

    /// A rustls client configuration as redis-rs makes one for the same settings: the CA
    /// file's roots (else the Mozilla roots), the client certificate if any, and no verification
    /// at all when `insecure` (`rediss://...#insecure`).
    ///
    /// # Errors
    /// As [`Tls::new`].
    pub(crate) fn client_config(&self, insecure: bool) -> Result<Arc<ClientConfig>, String> {
        let mut store = RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for cert in roots(ca)? {
                    store.add(cert).map_err(|err| format!("a CA certificate is not usable: {err}"))?;
                }
            }
            None => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let builder = ClientConfig::builder().with_root_certificates(store);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let (chain, key) = client_identity(cert, key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|err| format!("the client certificate and key cannot be used together: {err}"))?
            }
            None => builder.with_no_client_auth(),
        };
        if insecure {
            config.enable_sni = false;
            config.dangerous().set_certificate_verifier(Arc::new(NoVerification {
                supported: rustls::crypto::ring::default_provider().signature_verification_algorithms,
            }));
        }
        Ok(Arc::new(config))
    }
}

/// The certificates of a CA PEM.
fn roots(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("the CA file is not PEM certificates: {err}"))
}

/// The client certificate chain and key of two PEMs.
fn client_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("the client certificate file is not PEM certificates: {err}"))?;
    if chain.is_empty() {
        return Err("the client certificate file holds no PEM certificate".to_owned());
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|err| format!("the client key file holds no usable PEM private key: {err}"))?;
    Ok((chain, key))
}

/// The server name to verify for `host`: an IP address or a DNS name.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|err| format!("'{host}' is no TLS server name: {err}"))
}

/// A TLS failure in `err` or its sources that retrying will not mend, said for an operator;
/// `None` when there is none.
pub(crate) fn problem(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(tls) = rustls_error(err) {
            return explain(tls);
        }
        next = err.source();
    }
    explain_text(&err.to_string())
}

/// The rustls error `err` is, or wraps as an I/O error (how tokio-rustls reports one, and
/// `io::Error::source` skips the error it wraps).
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    // redis-rs keeps the error it wraps as an `Arc<dyn Error + Send + Sync>`, whose `source`
    // skips to the wrapped error's own source: look inside the `Arc` instead.
    let inner = match err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        Some(inner) => &**inner as &(dyn std::error::Error + 'static),
        None => err,
    };
    if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    inner.downcast_ref::<std::io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>()
}

fn explain(err: &rustls::Error) -> Option<String> {
    let hint = match err {
        rustls::Error::InvalidCertificate(certificate) => certificate_hint(&format!("{certificate:?}")),
        rustls::Error::AlertReceived(alert) => alert_hint(&format!("{alert:?}"))?,
        rustls::Error::InvalidMessage(_) => NOT_TLS,
        _ => return None,
    };
    Some(format!("TLS handshake failed: {err}: {hint}"))
}

/// The same explanation from an error's text, for the errors that keep only the text of the
/// rustls error (the cluster client's "Failed to create initial connections - Io: ...").
fn explain_text(message: &str) -> Option<String> {
    let name_after = |marker: &str| {
        let at = message.find(marker)? + marker.len();
        let rest = &message[at..];
        let end = rest.find(|char: char| !char.is_ascii_alphanumeric()).unwrap_or(rest.len());
        Some(rest[..end].to_owned())
    };
    if let Some(name) = name_after("invalid peer certificate: ") {
        return Some(format!(
            "TLS handshake failed: invalid peer certificate: {name}: {}",
            certificate_hint(&name)
        ));
    }
    let name = name_after("received fatal alert: ")?;
    Some(format!("TLS handshake failed: received fatal alert: {name}: {}", alert_hint(&name)?))
}

const NOT_TLS: &str = "the server does not speak TLS on this port: use redis://, or its TLS port";

/// What to do about a server certificate rustls refused, by the `CertificateError` variant's name.
fn certificate_hint(name: &str) -> &'static str {
    let variant = name.split(|char: char| !char.is_ascii_alphanumeric()).next().unwrap_or_default();
    match variant {
        "UnknownIssuer" => {
            "the server's certificate is not signed by a CA toolhost trusts: set [redis] ca_file to the CA that \
             signed it"
        }
        "NotValidForName" | "NotValidForNameContext" => {
            "the server's certificate does not name the host in the URL: connect by a name or address the \
             certificate lists"
        }
        "Expired" | "ExpiredContext" | "NotValidYet" | "NotValidYetContext" => {
            "the server's certificate is outside its validity period (or this host's clock is wrong)"
        }
        _ => "the server's certificate cannot be trusted",
    }
}

/// What to do about an alert the server sent, by the `AlertDescription` variant's name; `None`
/// for alerts that say nothing about the configuration.
fn alert_hint(name: &str) -> Option<&'static str> {
    Some(match name {
        "CertificateRequired"
        | "BadCertificate"
        | "UnknownCA"
        | "CertificateUnknown"
        | "CertificateExpired"
        | "CertificateRevoked"
        | "UnsupportedCertificate"
        | "AccessDenied" => {
            "the server refused toolhost's client certificate (or its absence): set [redis] client_cert_file \
             and client_key_file to a certificate signed by a CA the server trusts"
        }
        "HandshakeFailure" | "ProtocolVersion" => {
            "the server and toolhost share no TLS version or cipher suite"
        }
        _ => return None,
    })
}

/// Accepts any server certificate: `rediss://...#insecure`, as redis-rs does it. Signatures are
/// not checked either; only the algorithms offered are the provider's.
#[derive(Debug)]
struct NoVerification {
    supported: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.supported.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_pem_is_refused_with_a_message_that_names_the_file() {
        let err = Tls::new(Some(b"not a certificate".to_vec()), None).unwrap_err();
        assert!(err.contains("CA file holds no PEM certificate"), "{err}");
        let err = Tls::new(None, Some((b"".to_vec(), b"".to_vec()))).unwrap_err();
        assert!(err.contains("client certificate file holds no PEM certificate"), "{err}");
        assert!(Tls::new(None, None).unwrap().is_empty());
        assert!(Tls::default().certificates().is_none());
    }

    #[test]
    fn failures_kept_only_as_text_are_explained_too() {
        let message = explain_text(
            "Failed to create initial connections - Io: invalid peer certificate: UnknownIssuer",
        )
        .unwrap();
        assert!(message.contains("UnknownIssuer") && message.contains("set [redis] ca_file"), "{message}");
        let message = explain_text("Io: received fatal alert: CertificateRequired").unwrap();
        assert!(message.contains("client_cert_file"), "{message}");
        assert_eq!(explain_text("received fatal alert: DecodeError"), None);
        assert_eq!(explain_text("Connection refused (os error 111)"), None);
    }

    #[test]
    fn certificate_failures_are_explained_through_io_and_arc_wrappers() {
        use rustls::{AlertDescription, CertificateError};
        let rustls = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls);
        let message = problem(&io).unwrap();
        assert!(message.contains("UnknownIssuer") && message.contains("ca_file"), "{message}");
        let redis = redis::RedisError::from(io);
        assert!(problem(&redis).unwrap().contains("ca_file"));
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        assert!(problem(&alert).unwrap().contains("client_cert_file"));
        assert!(problem(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)).is_none());
    }
}
