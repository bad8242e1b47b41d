//! Egress: the network policy every outbound call to an address a tenant chose goes through
//! (HTTP tools, MCP servers and hooks in the worker; webhook deliveries; the API's check of a
//! webhook URL at save), and the reqwest clients that enforce it.
//!
//! Those URLs come from tenants and redirects come from whatever server answers, so without a
//! policy a tenant could make Spool reach its own loopback services, the private network or
//! the cloud metadata endpoint (server-side request forgery). Only public unicast addresses are
//! permitted, unless an operator allows a network with `SPOOL_TOOLS_ALLOW_NETWORKS`
//! ([`crate::config::EgressArgs`]). Model providers are the operator's own addresses and are
//! not screened.
//!
//! What must stay true:
//! - The address checked is the address connected to. Host names are checked inside the DNS
//!   resolver the client connects with (so DNS rebinding cannot swap the answer after the check),
//!   and IP-literal hosts, which hyper connects to without asking the resolver, are checked by
//!   [`NetworkPolicy::check_url`] before the request and again on every redirect.
//! - Every outbound call of a run (HTTP tools, MCP servers, hooks) gets its client from
//!   [`GuardedClients::for_url`], which runs that check on the URL it will call: there is no way
//!   to the guarded clients that skips it.
//! - IPv6 forms that carry an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by the IPv4
//!   address they reach; forms whose target cannot be judged cleanly (IPv4-compatible, Teredo)
//!   are refused.
//! - The client never uses a proxy: a proxy would make the connection, out of our sight.
//! - A request that carries configured headers (often credentials) is never redirected to
//!   another origin: reqwest drops only `Authorization` and cookies on such a hop, and would send
//!   an `X-Api-Key` to whatever host a tool server (or an open redirect on it) points at.
//!   [`GuardedClients::for_url`] with `credentials` picks the client that stays on the origin.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect;

/// How many redirects one tool call may follow.
pub const MAX_REDIRECTS: usize = 5;

/// Which addresses tools may connect to: public unicast addresses, plus any network the
/// operator allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkPolicy {
    allowed: Vec<IpNet>,
    /// Only the allowed networks, public addresses refused: the policy of clear text.
    only_allowed: bool,
}

/// A connection the network policy refused.
///
/// It travels inside reqwest's error chain (from the resolver or the redirect policy), so
/// callers can tell a refusal from an ordinary network failure by downcasting.
#[derive(Debug, thiserror::Error)]
#[error("refused by the network policy: {reason}")]
pub struct Refused {
    reason: String,
}

impl Refused {
    /// A refusal for the given human-readable reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// Why the connection was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl NetworkPolicy {
    /// Refuses every special range; allows only public addresses.
    pub fn strict() -> Self {
        Self::default()
    }

    /// Parses a comma-separated allow list of CIDRs or IPs (empty string = strict).
    ///
    /// Whitespace around entries and empty entries are ignored; a single IP allows just that
    /// address; host bits in a CIDR are ignored (`10.1.2.3/8` allows `10.0.0.0/8`).
    pub fn parse(allow: &str) -> anyhow::Result<Self> {
        let mut allowed = Vec::new();
        for entry in allow
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            let net = if entry.contains('/') {
                entry.parse::<IpNet>().map(|net| net.trunc()).ok()
            } else {
                entry.parse::<IpAddr>().map(IpNet::from).ok()
            };
            let net = net.with_context(|| {
                format!("allowed network `{entry}` is neither a CIDR nor an IP address")
            })?;
            allowed.push(net);
        }
        Ok(Self {
            allowed,
            only_allowed: false,
        })
    }

    /// The policy for calls in clear text (`http://` webhook endpoints): only the networks the
    /// operator allowed explicitly, never a public address. An operator who allows a network
    /// vouches for it (a private network, a sidecar); the public internet gets only TLS.
    pub fn cleartext(&self) -> Self {
        Self {
            allowed: self.allowed.clone(),
            only_allowed: true,
        }
    }

    /// The networks the operator allowed on top of the public addresses.
    pub fn allowed(&self) -> &[IpNet] {
        &self.allowed
    }

    /// Whether connecting to `ip` is permitted.
    pub fn permits(&self, ip: IpAddr) -> bool {
        self.refusal(ip).is_none()
    }

    /// Checks a URL before any connection: scheme http/https only, and an IP-literal host must
    /// be permitted.
    ///
    /// Returns a human-readable reason on refusal. A host name passes here: its addresses are
    /// checked when the guarded client resolves it.
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(format!(
                    "scheme `{other}` is not allowed (only http and https)"
                ));
            }
        }
        let Some(host) = url.host_str() else {
            return Err("the URL has no host".to_owned());
        };
        // The URL parser already turned every IPv4 spelling (decimal, hex, octal, short) into
        // dotted decimal and bracketed IPv6, so what does not parse here is a name.
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let Ok(ip) = literal.parse::<IpAddr>() else {
            return Ok(());
        };
        let Some(kind) = self.refusal(ip) else {
            return Ok(());
        };
        if self.only_allowed {
            return Err(format!("{ip} is {kind}"));
        }
        let reached = match ip {
            IpAddr::V6(v6) => embedded_v4(v6),
            IpAddr::V4(_) => None,
        };
        Err(match reached {
            Some(v4) => format!("{ip} reaches {v4}, which is {kind}, not a public address"),
            None => format!("{ip} is {kind}, not a public address"),
        })
    }

    /// Why `ip` may not be reached, or `None` when it may.
    fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        if self.allowed.iter().any(|net| net.contains(&ip)) {
            return None;
        }
        if self.only_allowed {
            return Some(
                "outside the networks allowed for clear text (SPOOL_TOOLS_ALLOW_NETWORKS)",
            );
        }
        match ip {
            IpAddr::V4(v4) => special_v4(v4),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                // The IPv4 address is where the packets end up, so it is what gets judged
                // (allow list included).
                Some(v4) => self.refusal(IpAddr::V4(v4)),
                None => special_v6(v6),
            },
        }
    }
}

/// IPv4 ranges tools may not reach, most specific first, with what they are.
const SPECIAL_V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "in \"this network\" (0.0.0.0/8)"),
    ([10, 0, 0, 0], 8, "a private address (RFC 1918)"),
    (
        [100, 64, 0, 0],
        10,
        "a shared CGNAT address (100.64.0.0/10)",
    ),
    ([127, 0, 0, 0], 8, "a loopback address"),
    (
        [169, 254, 0, 0],
        16,
        "a link-local address (cloud metadata lives here)",
    ),
    ([172, 16, 0, 0], 12, "a private address (RFC 1918)"),
    (
        [192, 0, 0, 0],
        24,
        "an IETF protocol assignment (192.0.0.0/24)",
    ),
    ([192, 0, 2, 0], 24, "a documentation address"),
    ([192, 88, 99, 0], 24, "a 6to4 relay anycast address"),
    ([192, 168, 0, 0], 16, "a private address (RFC 1918)"),
    (
        [198, 18, 0, 0],
        15,
        "a benchmarking address (198.18.0.0/15)",
    ),
    ([198, 51, 100, 0], 24, "a documentation address"),
    ([203, 0, 113, 0], 24, "a documentation address"),
    ([224, 0, 0, 0], 4, "a multicast address"),
    ([255, 255, 255, 255], 32, "the broadcast address"),
    ([240, 0, 0, 0], 4, "a reserved address (240.0.0.0/4)"),
];

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let ip = u32::from(ip);
    SPECIAL_V4.iter().find_map(|&(net, len, kind)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        (ip & mask == u32::from_be_bytes(net)).then_some(kind)
    })
}

/// IPv6 ranges inside global unicast (2000::/3) that tools may not reach anyway.
const SPECIAL_V6_GLOBAL: &[(u128, u8, &str)] = &[
    (0x2001_0000 << 96, 32, "a Teredo address"),
    (
        0x2001_0000 << 96,
        23,
        "an IETF protocol assignment (2001::/23)",
    ),
    (0x2001_0db8 << 96, 32, "a documentation address"),
    (0x3fff_0000 << 96, 20, "a documentation address"),
];

/// Named IPv6 ranges outside global unicast, for a clearer reason than "reserved".
const SPECIAL_V6_OTHER: &[(u128, u8, &str)] = &[
    (0, 128, "the unspecified address"),
    (1, 128, "a loopback address"),
    (0, 96, "an IPv4-compatible address (deprecated)"),
    (0x0064_ff9b_0001 << 80, 48, "a local-use NAT64 address"),
    (0x0100 << 112, 64, "a discard-only address"),
    (0xfc00 << 112, 7, "a unique-local address (fc00::/7)"),
    (0xfe80 << 112, 10, "a link-local address"),
    (0xfec0 << 112, 10, "a site-local address (deprecated)"),
    (0xff00 << 112, 8, "a multicast address"),
];

fn in_v6(ip: u128, net: u128, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    ip & mask == net
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let ip = u128::from(ip);
    let find = |table: &[(u128, u8, &'static str)]| {
        table
            .iter()
            .find_map(|&(net, len, kind)| in_v6(ip, net, len).then_some(kind))
    };
    if in_v6(ip, 0x2000 << 112, 3) {
        find(SPECIAL_V6_GLOBAL)
    } else {
        // Nothing outside global unicast is a public destination.
        Some(
            find(SPECIAL_V6_OTHER)
                .unwrap_or("a reserved address (outside global unicast 2000::/3)"),
        )
    }
}

/// The IPv4 address an IPv6 address delivers to, for the forms that carry one cleanly:
/// IPv4-mapped (`::ffff:a.b.c.d`), NAT64 well-known prefix (`64:ff9b::a.b.c.d`) and 6to4
/// (`2002:aabb:ccdd::/48`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let bits = u128::from(ip);
    // Truncating casts pick the 32 bits that hold the IPv4 address.
    if in_v6(bits, 0x0064_ff9b << 96, 96) {
        return Some(Ipv4Addr::from(bits as u32));
    }
    if in_v6(bits, 0x2002 << 112, 16) {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    None
}

/// Resolves with the system resolver, then keeps only the addresses the policy permits.
struct GuardedResolver {
    policy: Arc<NetworkPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<_> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let permitted = screen(&policy, &host, resolved).map_err(|r| Box::new(r) as Box<_>)?;
            Ok(Box::new(permitted.into_iter()) as Addrs)
        })
    }
}

/// What the resolver hands to the connector for `host`: the permitted addresses of those the
/// system resolver returned, or a refusal when none is left (a name that resolves only to
/// loopback, private or metadata addresses, as DNS rebinding would make it).
pub fn screen(
    policy: &NetworkPolicy,
    host: &str,
    resolved: Vec<SocketAddr>,
) -> Result<Vec<SocketAddr>, Refused> {
    let (permitted, refused): (Vec<_>, Vec<_>) = resolved
        .into_iter()
        .partition(|addr| policy.permits(addr.ip()));
    if permitted.is_empty() {
        let refused: Vec<String> = refused.iter().map(|addr| addr.ip().to_string()).collect();
        let reason = if refused.is_empty() {
            format!("{host} resolves to no address")
        } else {
            format!(
                "{host} resolves only to addresses that are not public ({})",
                refused.join(", ")
            )
        };
        return Err(Refused::new(reason));
    }
    if !refused.is_empty() {
        tracing::debug!(%host, ?refused, "dropped addresses the network policy refuses");
    }
    Ok(permitted)
}

/// Where a guarded client follows redirects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirects {
    /// To any origin the policy permits.
    AnyOrigin,
    /// Only within the origin (scheme, host, port) of the request's URL; a redirect elsewhere
    /// comes back as the response, unfollowed.
    SameOrigin,
    /// Never: every redirect comes back as the response (webhook deliveries: a 303 would turn
    /// the signed POST into a GET whose 2xx would count as delivered).
    Never,
}

/// The two guarded clients tools, MCP servers and hooks use, which differ only in
/// [`Redirects`], with the policy they enforce.
#[derive(Clone, Debug)]
pub struct GuardedClients {
    policy: Arc<NetworkPolicy>,
    any_origin: reqwest::Client,
    same_origin: reqwest::Client,
}

impl GuardedClients {
    /// Both clients, enforcing `policy`, each call bounded by `timeout`.
    pub fn new(policy: &Arc<NetworkPolicy>, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            policy: Arc::clone(policy),
            any_origin: guarded_client(Arc::clone(policy), timeout, Redirects::AnyOrigin)?,
            same_origin: guarded_client(Arc::clone(policy), timeout, Redirects::SameOrigin)?,
        })
    }

    /// The policy the clients enforce.
    pub fn policy(&self) -> &NetworkPolicy {
        &self.policy
    }

    /// The client for a call to `url`, once `url` has passed the network policy (an IP-literal
    /// host is judged here, since the resolver never sees it). A call that carries
    /// `credentials` (configured headers, a signed identity) gets a client whose redirects
    /// stay on the URL's origin, so they never reach a host nobody named.
    pub fn for_url(&self, url: &Url, credentials: bool) -> Result<&reqwest::Client, Refused> {
        self.policy.check_url(url).map_err(Refused::new)?;
        Ok(if credentials {
            &self.same_origin
        } else {
            &self.any_origin
        })
    }
}

/// A reqwest client that enforces the policy: a DNS resolver that drops (and if nothing is
/// left, fails on) non-permitted addresses, so the address actually connected to is checked,
/// and a redirect policy that re-checks every hop with `check_url` (max 5 redirects) and, with
/// [`Redirects::SameOrigin`], stops at a hop to another origin.
///
/// Callers must still run [`NetworkPolicy::check_url`] on the first URL: hyper connects to an
/// IP-literal host without asking the resolver ([`GuardedClients::for_url`] does it). `timeout`
/// bounds the whole call, body included.
pub fn guarded_client(
    policy: Arc<NetworkPolicy>,
    timeout: Duration,
    follow: Redirects,
) -> anyhow::Result<reqwest::Client> {
    let resolver = GuardedResolver {
        policy: Arc::clone(&policy),
    };
    let redirects = redirect::Policy::custom(move |attempt| {
        // `previous` starts with the original URL, so it holds one more than the hops taken.
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        if follow == Redirects::Never {
            return attempt.stop();
        }
        if follow == Redirects::SameOrigin
            && attempt
                .previous()
                .first()
                .is_some_and(|first| first.origin() != attempt.url().origin())
        {
            return attempt.stop();
        }
        match policy.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(reason) => {
                let host = attempt
                    .url()
                    .host_str()
                    .unwrap_or("a URL without host")
                    .to_owned();
                attempt.error(Refused::new(format!("redirect to {host}: {reason}")))
            }
        }
    });
    reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(resolver)
        .redirect(redirects)
        // The tool's URL is the tenant's business, not the redirect target's.
        .referer(false)
        .timeout(timeout)
        .user_agent(concat!("spool-worker/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("building the HTTP tool client")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address parses")
    }

    #[test]
    fn the_strict_policy_permits_only_public_addresses() {
        let refused = [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.0.0.2",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::127.0.0.1",
            "::8.8.8.8",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "64:ff9b::127.0.0.1",
            "64:ff9b::10.1.2.3",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::8.8.8.8",
            "100::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:2::1",
            "2001:db8::1",
            "3fff::1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            "4000::1",
        ];
        let permitted = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
        ];
        let policy = NetworkPolicy::strict();
        for address in refused {
            assert!(!policy.permits(ip(address)), "{address} should be refused");
        }
        for address in permitted {
            assert!(policy.permits(ip(address)), "{address} should be permitted");
        }
    }

    #[test]
    fn an_allowed_network_is_permitted_in_every_form_that_reaches_it() {
        let policy = NetworkPolicy::parse(" 127.0.0.2/32 , 10.0.0.0/8,fd00::/8,").expect("parses");
        for address in [
            "127.0.0.2",
            "::ffff:127.0.0.2",
            "10.9.8.7",
            "64:ff9b::10.0.0.1",
            "fd00::5",
        ] {
            assert!(policy.permits(ip(address)), "{address} should be permitted");
        }
        for address in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "::1",
            "169.254.169.254",
            "fc00::1",
        ] {
            assert!(
                !policy.permits(ip(address)),
                "{address} should still be refused"
            );
        }
    }

    #[test]
    fn a_single_ip_allows_only_that_address() {
        let policy = NetworkPolicy::parse("192.168.1.10,::1").expect("parses");
        assert!(policy.permits(ip("192.168.1.10")));
        assert!(policy.permits(ip("::1")));
        assert!(!policy.permits(ip("192.168.1.11")));
        assert!(!policy.permits(ip("127.0.0.1")));
    }

    #[test]
    fn an_empty_allow_list_is_the_strict_policy() {
        assert_eq!(
            NetworkPolicy::parse("").expect("parses"),
            NetworkPolicy::strict()
        );
        assert_eq!(
            NetworkPolicy::parse(" , ").expect("parses"),
            NetworkPolicy::strict()
        );
    }

    #[test]
    fn host_bits_in_a_cidr_are_ignored() {
        let policy = NetworkPolicy::parse("10.1.2.3/8").expect("parses");
        assert_eq!(
            policy.allowed(),
            &["10.0.0.0/8".parse::<IpNet>().expect("parses")]
        );
    }

    #[test]
    fn malformed_allow_lists_are_rejected_and_name_the_bad_entry() {
        for bad in [
            "localhost",
            "10.0.0.0/33",
            "300.1.1.1",
            "10.0.0.0/8,nope",
            "::1/129",
            "10/8",
        ] {
            let err = NetworkPolicy::parse(bad).expect_err(bad);
            let entry = bad.rsplit(',').next().expect("has an entry");
            assert!(err.to_string().contains(entry), "{bad}: {err}");
        }
    }

    #[test]
    fn check_url_refuses_other_schemes_and_non_public_literals() {
        let policy = NetworkPolicy::strict();
        let check = |url: &str| policy.check_url(&Url::parse(url).expect("test URL parses"));
        assert!(check("https://example.com/tool").is_ok());
        assert!(check("http://8.8.8.8:8080/").is_ok());
        assert!(
            check("http://localhost/").is_ok(),
            "names are checked at resolution"
        );
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/",
            "gopher://example.com/",
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:169.254.169.254]/",
            "http://192.168.1.1/",
            "http://172.16.0.1/",
            "http://100.64.0.1/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[64:ff9b::a00:1]/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://0/",
        ] {
            let reason = check(url).expect_err(url);
            assert!(!reason.is_empty(), "{url}");
        }
        let reason = check("http://10.0.0.1/").expect_err("private");
        assert!(
            reason.contains("10.0.0.1") && reason.contains("private"),
            "{reason}"
        );
    }

    #[test]
    fn the_resolver_keeps_only_permitted_addresses_and_refuses_a_name_with_none() {
        let at = |text: &str| SocketAddr::new(ip(text), 443);
        let strict = NetworkPolicy::strict();
        // A name whose answer mixes a public address with the metadata endpoint and private
        // ones (DNS rebinding tries exactly this): only the public address is connected to.
        let mixed = vec![
            at("169.254.169.254"),
            at("93.184.216.34"),
            at("10.0.0.1"),
            at("fd00::1"),
            at("2606:2800:220:1::1"),
        ];
        assert_eq!(
            screen(&strict, "mixed.example", mixed).expect("public left"),
            [at("93.184.216.34"), at("2606:2800:220:1::1")]
        );
        for private in [
            vec![at("169.254.169.254")],
            vec![at("10.0.0.1"), at("192.168.1.1"), at("172.16.0.1")],
            vec![at("100.64.0.1"), at("fe80::1"), at("::ffff:127.0.0.1")],
            vec![at("64:ff9b::a9fe:a9fe")],
            Vec::new(),
        ] {
            let refused = screen(&strict, "inside.example", private.clone());
            assert!(refused.is_err(), "{private:?} was let through");
        }
        let allowed = NetworkPolicy::parse("10.0.0.0/8").expect("parses");
        assert_eq!(
            screen(
                &allowed,
                "inside.example",
                vec![at("10.0.0.1"), at("192.168.1.1")]
            )
            .expect("allowed network left"),
            [at("10.0.0.1")]
        );
    }

    #[test]
    fn the_url_parser_normalizes_numeric_ipv4_forms() {
        for url in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
        ] {
            let parsed = Url::parse(url).expect("parses");
            assert_eq!(parsed.host_str(), Some("127.0.0.1"), "{url}");
        }
    }
}
