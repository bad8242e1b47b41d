//! Lists, newest first, with cursor pagination (docs/api.md): `?limit=` (default 20, at most 100)
//! and `?cursor=` (the previous page's `next_cursor`).
//!
//! Pages are keyed on `(created_at, id)`, which never change, so a row never moves between
//! pages however the list grows meanwhile, and each page is one range scan of an index in that
//! order. The cursor is the key of the page's last row, hex-encoded (opaque to clients; a
//! cursor that does not decode is a 400).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db::threads::Owner;

/// Rows per page when `?limit=` is absent.
pub const DEFAULT_LIMIT: i64 = 20;
/// The largest `?limit=`.
pub const MAX_LIMIT: i64 = 100;

/// Where a page starts: after the row with this key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The last row's creation time.
    pub created_at: DateTime<Utc>,
    /// The last row's id.
    pub id: Uuid,
}

impl Cursor {
    /// The cursor as clients see it.
    pub fn encode(&self) -> String {
        hex::encode(format!(
            "{}.{}",
            self.created_at.timestamp_micros(),
            self.id.simple()
        ))
    }

    /// A cursor from [`Cursor::encode`], or `None` for anything else.
    pub fn decode(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        let text = std::str::from_utf8(&bytes).ok()?;
        let (micros, id) = text.split_once('.')?;
        Some(Self {
            created_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
            id: Uuid::try_parse(id).ok()?,
        })
    }
}

/// Whose rows a list shows: a user's own, or (for an admin) the whole tenant's.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// The user's own.
    Owner(&'a Owner),
    /// Every user's of the tenant.
    Tenant(&'a str),
}

impl Scope<'_> {
    /// Adds ` AND {alias}.tenant_id = .. [AND {alias}.owner_id = ..]` to `query`.
    pub(crate) fn push(&self, query: &mut sqlx::QueryBuilder<sqlx::Postgres>, alias: &str) {
        match self {
            Scope::Owner(owner) => {
                query.push(format_args!(" AND {alias}.tenant_id = "));
                query.push_bind(owner.tenant_id.clone());
                query.push(format_args!(" AND {alias}.owner_id = "));
                query.push_bind(owner.user_id.clone());
            }
            Scope::Tenant(tenant) => {
                query.push(format_args!(" AND {alias}.tenant_id = "));
                query.push_bind((*tenant).to_owned());
            }
        }
    }
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct Page<T> {
    /// The rows, newest first.
    pub rows: Vec<T>,
    /// Where the next page starts (`None` on the last page).
    pub next: Option<Cursor>,
}

/// Adds the cursor's condition (rows strictly older than it) to `query`.
pub(crate) fn push_after(
    query: &mut sqlx::QueryBuilder<sqlx::Postgres>,
    alias: &str,
    after: Option<Cursor>,
) {
    if let Some(after) = after {
        query.push(format_args!(" AND ({alias}.created_at, {alias}.id) < ("));
        query.push_bind(after.created_at);
        query.push(", ");
        query.push_bind(after.id);
        query.push(")");
    }
}

/// Adds the order and `limit + 1` (the extra row says whether there is a next page).
pub(crate) fn push_order(query: &mut sqlx::QueryBuilder<sqlx::Postgres>, alias: &str, limit: i64) {
    query.push(format_args!(
        " ORDER BY {alias}.created_at DESC, {alias}.id DESC LIMIT "
    ));
    query.push_bind(limit + 1);
}

/// The page of `rows` (fetched with `limit + 1`), with the cursor of its last row.
pub(crate) fn page<T>(
    mut rows: Vec<T>,
    limit: i64,
    key: impl Fn(&T) -> (DateTime<Utc>, Uuid),
) -> Page<T> {
    let limit = usize::try_from(limit).unwrap_or(0);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|row| {
            let (created_at, id) = key(row);
            Cursor { created_at, id }
        })
    } else {
        None
    };
    Page { rows, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_garbage_does_not_decode() {
        let cursor = Cursor {
            created_at: DateTime::from_timestamp_micros(1_763_900_000_123_456).expect("time"),
            id: Uuid::now_v7(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        for bad in ["", "zz", "00", &hex::encode("1.2"), &hex::encode("x.y")] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
