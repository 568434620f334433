//! URLs and secrets as they may be printed.

/// `***` for a non-empty secret, empty for none.
pub fn mask_secret(secret: &str) -> &'static str {
    if secret.is_empty() { "" } else { "***" }
}

/// A Redis URL with its password, and the values of its `pass` and `password` query parameters
/// (which the daemon counts as secrets too), replaced by `***`.
///
/// The user information ends at the last `@`, wherever it is: a password with an unescaped `/`,
/// `?` or `#` is still masked whole, at worst together with some of what follows it. Text with
/// an `@` and no scheme (a mistyped `user:password@host:port`) is masked the same way.
pub fn mask_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(scheme_end) => url.split_at(scheme_end + 3),
        None => ("", url),
    };
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let masked = match userinfo.find(':') {
                Some(colon) => format!("{}:***@", &userinfo[..colon]),
                None => "***@".to_owned(),
            };
            (masked, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let after = match after.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name @ ("pass" | "password"), _)) => format!("{name}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => after.to_owned(),
    };
    format!("{scheme}{userinfo}{after}")
}

/// `%XX` escapes decoded; anything that is not a valid escape, or decodes to invalid UTF-8, is
/// kept as written.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut res = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                res.push(byte);
                index += 3;
            }
            None => {
                res.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8(res).unwrap_or_else(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_masked() {
        assert_eq!(mask_url("redis://user:pw@host:6379/0"), "redis://user:***@host:6379/0");
        assert_eq!(mask_url("rediss://:pw@host"), "rediss://:***@host");
        assert_eq!(mask_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(mask_url("redis://:pa/ss@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(mask_url("redis://token@host"), "redis://***@host");
        // Query parameters counted as secrets, and credentials written without a scheme.
        assert_eq!(
            mask_url("unix:///run/redis.sock?db=1&pass=s3cret"),
            "unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(mask_url("redis://h:1/0?password=s3cret&x=1"), "redis://h:1/0?password=***&x=1");
        assert_eq!(mask_url("ops:s3cret@10.0.0.1:7000"), "ops:***@10.0.0.1:7000");
        assert_eq!(mask_url("10.0.0.1:7000"), "10.0.0.1:7000");
    }

    #[test]
    fn escapes_decode_and_broken_ones_stay() {
        assert_eq!(percent_decode("p%40ss%2Fw"), "p@ss/w");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
