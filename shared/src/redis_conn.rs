//! Redis connections as every part of Spool makes them: one server or a Redis Cluster
//! (`REDIS_URL` lists the nodes, comma-separated), multiplexed, reconnecting, connecting
//! lazily (a process starts, and its runs complete, while Redis is down), with `TCP_NODELAY`
//! on. The thread streams ([`crate::stream`]), the quota counters
//! ([`crate::quota::admission`]) and the gateway's pub/sub all connect through here.
//!
//! Blocking reads (`XREAD BLOCK`) must not use these multiplexed connections: the response
//! timeout below is shorter than any block.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

/// A Redis connection: one server, or a Redis Cluster (`REDIS_URL` lists several nodes,
/// comma-separated). Multiplexed and reconnecting either way; connecting lazily, so a process
/// starts (and its runs complete) while Redis is down.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(ConnectionManager),
    /// A cluster: commands are routed by their keys' slot (a thread's keys share one).
    Cluster(LazyCluster),
}

/// A cluster connection made on first use (and retried until it is made).
#[derive(Clone)]
pub struct LazyCluster {
    client: Arc<redis::cluster::ClusterClient>,
    conn: Arc<tokio::sync::OnceCell<ClusterConnection>>,
}

impl LazyCluster {
    async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

impl redis::aio::ConnectionLike for RedisConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(cluster) => Box::pin(async move {
                let mut conn = cluster.get().await?;
                conn.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(cluster) => Box::pin(async move {
                let mut conn = cluster.get().await?;
                conn.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The nodes a `REDIS_URL` names: one, or several comma-separated (a cluster).
pub fn nodes(url: &str) -> Vec<String> {
    url.split(',')
        .map(str::trim)
        .filter(|node| !node.is_empty())
        .map(|node| {
            if node.contains("://") {
                node.to_owned()
            } else {
                format!("redis://{node}")
            }
        })
        .collect()
}

/// TCP as every Redis connection of ours uses it: `TCP_NODELAY` on. redis-rs leaves Nagle's
/// algorithm on by default, and on a multiplexed connection a command written while an earlier one
/// is unanswered is then held until that one is ACKed (up to a delayed ACK's 40 ms on a network).
/// On loopback it made no difference we could measure (docs/benchmarks-history.md, "A slow machine,
/// and Nagle on the Redis connections").
fn tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// A client of one Redis node (`url`, a `redis://`, `rediss://` or `redis+unix://` URL), with
/// `TCP_NODELAY` on (see `tcp`).
pub fn client(url: &str) -> redis::RedisResult<redis::Client> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)?.set_tcp_settings(tcp());
    redis::Client::open(info)
}

/// Opens a connection to `url`: a cluster if it lists several nodes.
pub fn connect(url: &str) -> redis::RedisResult<RedisConn> {
    let nodes = nodes(url);
    if nodes.len() > 1 {
        let client = redis::cluster::ClusterClient::builder(nodes)
            .tcp_settings(tcp())
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(2))
            .build()?;
        return Ok(RedisConn::Cluster(LazyCluster {
            client: Arc::new(client),
            conn: Arc::default(),
        }));
    }
    let client = client(nodes.first().map_or(url, String::as_str))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    Ok(RedisConn::Single(
        client.get_connection_manager_lazy(config)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_sends_without_nagle_and_keeps_its_url() {
        let node = client("redis://127.0.0.1:6390/3").expect("a valid URL");
        let info = node.get_connection_info();
        assert!(info.tcp_settings().nodelay());
        assert_eq!(info.redis_settings().db(), 3);
        assert!(client("not a url").is_err());
    }

    #[tokio::test]
    async fn a_url_with_several_nodes_names_a_cluster() {
        assert_eq!(nodes("redis://127.0.0.1:6379"), ["redis://127.0.0.1:6379"]);
        assert_eq!(
            nodes("redis://a:7000, b:7001,,redis://c:7002"),
            ["redis://a:7000", "redis://b:7001", "redis://c:7002"]
        );
        assert!(matches!(
            connect("redis://a:7000,redis://b:7001"),
            Ok(RedisConn::Cluster(_))
        ));
        assert!(matches!(
            connect("redis://127.0.0.1:6379"),
            Ok(RedisConn::Single(_))
        ));
    }
}
