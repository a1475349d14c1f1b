//! The chat's limits ([`Config`]) and the [`WsLimiter`] they make.

use std::error::Error;
use std::time::Duration;

use flowgate::Quota;
use flowgate::ws::{PenaltyConfig, WsLimiter, WsPolicyError};
use ipnet::IpNet;

/// The role that slowmode does not apply to.
pub const MODERATOR: &str = "moderator";

/// `limit` per `seconds`, checked at compile time (so `Config::default` cannot fail). With GCRA,
/// "8 per 8 s" is a burst of 8 that refills one per second.
const fn quota(limit: u64, seconds: u64) -> Quota {
    match Quota::new(limit, Duration::from_secs(seconds)) {
        Ok(quota) => quota,
        Err(_) => panic!("invalid quota"),
    }
}

/// Every limit of the chat. [`Config::default`] is the demo's: tight enough that a person
/// typing fast sees each layer at work.
#[derive(Debug, Clone)]
pub struct Config {
    /// New connections per client IP (a reload is a new connection); beyond, HTTP 429.
    pub connections_per_ip: Quota,
    /// Connections open at once per client IP.
    pub concurrent_per_ip: u32,
    /// Connections open at once per name (tabs).
    pub concurrent_per_user: u32,
    /// Messages per connection (their cost: `typing` is free).
    pub messages: Quota,
    /// Bytes per connection, so that free messages cannot flood either.
    pub bytes: Quota,
    /// Messages per name across all of its tabs.
    pub user_messages: Quota,
    /// Messages per room, from all of its members together.
    pub room_messages: Quota,
    /// One message per this interval per name and room; moderators are exempt. `None`: off.
    pub slowmode: Option<Duration>,
    /// The largest message accepted; a bigger one closes the connection with 1009.
    pub max_message_size: usize,
    /// Rejected messages tolerated within [`close_within`](Self::close_within); the next one
    /// closes the connection.
    pub close_after: u64,
    /// The window of [`close_after`](Self::close_after).
    pub close_within: Duration,
    /// The close code for repeated violations (Discord's 4008).
    pub close_code: u16,
    /// The close reason sent with it (at most 123 bytes).
    pub close_reason: String,
    /// Malformed messages per connection before it is closed (1008).
    pub errors: Quota,
    /// Names closed for violations too often are refused for a while.
    pub penalty: PenaltyConfig,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connections_per_ip: quota(10, 20),
            concurrent_per_ip: 20,
            concurrent_per_user: 4,
            messages: quota(8, 8),
            bytes: quota(16 * 1024, 4),
            user_messages: quota(15, 30),
            room_messages: quota(20, 10),
            slowmode: Some(Duration::from_secs(2)),
            max_message_size: 2048,
            close_after: 3,
            close_within: Duration::from_secs(10),
            close_code: 4008,
            close_reason: "rate limited: too many rejected messages".to_owned(),
            errors: quota(10, 60),
            penalty: PenaltyConfig {
                after_closes: 3,
                first: Duration::from_secs(30),
                max: Duration::from_secs(600),
                forget_after: Duration::from_secs(600),
                max_entries: 10_000,
            },
            trusted_proxies: vec![loopback_v4(), loopback_v6()],
        }
    }
}

fn loopback_v4() -> IpNet {
    IpNet::V4(ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::LOCALHOST, 8))
}

fn loopback_v6() -> IpNet {
    IpNet::V6(ipnet::Ipv6Net::new_assert(
        std::net::Ipv6Addr::LOCALHOST,
        128,
    ))
}

impl Config {
    /// The defaults, changed by the environment: `TRUSTED_PROXIES` (comma-separated CIDRs;
    /// empty for none), `SLOWMODE_SECS` (0 turns slowmode off), `CLOSE_CODE` (e.g. 1008).
    pub fn from_env() -> Result<Self, Box<dyn Error>> {
        let mut config = Config::default();
        if let Ok(cidrs) = std::env::var("TRUSTED_PROXIES") {
            config.trusted_proxies = cidrs
                .split(',')
                .map(str::trim)
                .filter(|cidr| !cidr.is_empty())
                .map(|cidr| {
                    cidr.parse()
                        .map_err(|e| format!("TRUSTED_PROXIES: {cidr}: {e}"))
                })
                .collect::<Result<_, _>>()?;
        }
        if let Ok(secs) = std::env::var("SLOWMODE_SECS") {
            let secs: u64 = secs.parse().map_err(|e| format!("SLOWMODE_SECS: {e}"))?;
            config.slowmode = (secs > 0).then(|| Duration::from_secs(secs));
        }
        if let Ok(code) = std::env::var("CLOSE_CODE") {
            config.close_code = code.parse().map_err(|e| format!("CLOSE_CODE: {e}"))?;
        }
        Ok(config)
    }

    /// The limiter these settings describe (refused, e.g., for a close code that cannot be
    /// sent).
    pub fn limiter(&self) -> Result<WsLimiter, WsPolicyError> {
        let mut builder = WsLimiter::builder()
            .connections_per_ip(self.connections_per_ip)
            .concurrent_per_ip(self.concurrent_per_ip)
            .concurrent_per_user(self.concurrent_per_user)
            .messages(self.messages)
            .bytes(self.bytes)
            .user_messages(self.user_messages)
            .room_messages(self.room_messages)
            .slowmode_exempt(MODERATOR)
            .cost("typing", 0)
            .max_message_size(self.max_message_size)
            .errors(self.errors)
            .close_after(self.close_after, self.close_within)
            .close_code(self.close_code, &self.close_reason)
            .penalty_box(self.penalty);
        if let Some(interval) = self.slowmode {
            builder = builder.slowmode(interval);
        }
        builder.build()
    }

    /// The limits in words, for the page.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "New connections: {} per IP; at most {} open per IP and {} per name (HTTP 429 beyond).",
                rate(&self.connections_per_ip),
                self.concurrent_per_ip,
                self.concurrent_per_user,
            ),
            format!("Messages: {} per tab.", rate(&self.messages)),
            format!(
                "Per name, across all its tabs: {}.",
                rate(&self.user_messages)
            ),
            format!(
                "Per room, all members together: {}.",
                rate(&self.room_messages)
            ),
        ];
        if let Some(interval) = self.slowmode {
            lines.push(format!(
                "Slowmode: one message per {} per name and room; moderators are exempt.",
                span(interval)
            ));
        }
        lines.extend([
            "Typing notices cost nothing.".to_owned(),
            format!(
                "Data: {} bytes per {} per tab; a message over {} bytes closes the connection with 1009.",
                self.bytes.limit(),
                span(self.bytes.period()),
                self.max_message_size
            ),
            format!(
                "After {} rejected messages within {}, the next one closes the connection with {}.",
                self.close_after,
                span(self.close_within),
                self.close_code
            ),
            format!(
                "{} such closes and the name is refused for {} (doubling each time).",
                self.penalty.after_closes,
                span(self.penalty.first)
            ),
        ]);
        lines
    }
}

/// "8 per 8 s".
fn rate(quota: &Quota) -> String {
    format!("{} per {}", quota.limit(), span(quota.period()))
}

/// "2 s", "1.5 s", "10 min".
fn span(d: Duration) -> String {
    match d.as_millis() {
        ms if ms >= 60_000 && ms % 60_000 == 0 => format!("{} min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{} s", ms as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_build_and_read_well() {
        let config = Config::default();
        assert!(config.limiter().is_ok());
        let text = config.describe().join("\n");
        assert!(text.contains("Messages: 8 per 8 s per tab."), "{text}");
        assert!(text.contains("one message per 2 s"), "{text}");
        assert!(text.contains("closes the connection with 4008"), "{text}");
        assert_eq!(span(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(span(Duration::from_secs(600)), "10 min");
    }

    #[test]
    fn a_close_code_that_cannot_be_sent_is_refused() {
        let config = Config {
            close_code: 1005,
            ..Config::default()
        };
        assert_eq!(
            config.limiter().unwrap_err(),
            WsPolicyError::InvalidCloseCode(1005)
        );
    }
}
