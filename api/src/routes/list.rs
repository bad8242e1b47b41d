//! The query of a list route (docs/api.md): `?limit=` (1 to 100, default 20), `?cursor=` (the
//! previous page's `next_cursor`), and the route's filters, some repeatable. Parsed by hand
//! rather than into a struct: filters such as `metadata[key]=value` have keys chosen by the
//! caller, and `status` may repeat. Anything else is a 400 with a code, never ignored.

use axum::extract::{FromRequestParts, RawQuery};
use axum::http::request::Parts;
use serde::Serialize;

use spool_shared::db::page::{Cursor, DEFAULT_LIMIT, MAX_LIMIT, Page};

use crate::error::ApiError;

/// A list request's page and filters.
#[derive(Debug)]
pub struct ListQuery {
    /// Rows per page.
    pub limit: i64,
    /// Where the page starts.
    pub cursor: Option<Cursor>,
    /// The other parameters, in order, not yet understood.
    filters: Vec<(String, String)>,
}

impl<S: Send + Sync> FromRequestParts<S> for ListQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let RawQuery(query) = RawQuery::from_request_parts(parts, state)
            .await
            .unwrap_or(RawQuery(None));
        let mut list = Self {
            limit: DEFAULT_LIMIT,
            cursor: None,
            filters: Vec::new(),
        };
        let mut seen_limit = false;
        let mut seen_cursor = false;
        let pairs = form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes());
        for (key, value) in pairs {
            if key.contains('\0') || value.contains('\0') {
                return Err(ApiError::bad_request(
                    "invalid_filter",
                    "query parameters must not contain the NUL character",
                ));
            }
            match &*key {
                "limit" => {
                    list.limit = value
                        .parse()
                        .ok()
                        .filter(|limit| (1..=MAX_LIMIT).contains(limit) && !seen_limit)
                        .ok_or_else(|| {
                            ApiError::bad_request(
                                "invalid_limit",
                                format!("limit must be given once, from 1 to {MAX_LIMIT}"),
                            )
                        })?;
                    seen_limit = true;
                }
                "cursor" => {
                    list.cursor = Some(
                        Cursor::decode(&value)
                            .filter(|_| !seen_cursor)
                            .ok_or_else(|| {
                                ApiError::bad_request(
                                    "invalid_cursor",
                                    "cursor must be the next_cursor of a previous page",
                                )
                            })?,
                    );
                    seen_cursor = true;
                }
                _ => list.filters.push((key.into_owned(), value.into_owned())),
            }
        }
        Ok(list)
    }
}

impl ListQuery {
    /// Takes the filters out: each is given to `accept`, which says whether it knows it; the
    /// first it does not know is a 400 `unknown_parameter`.
    pub fn filters(
        &mut self,
        mut accept: impl FnMut(&str, String) -> Result<bool, ApiError>,
    ) -> Result<(), ApiError> {
        for (key, value) in std::mem::take(&mut self.filters) {
            if !accept(&key, value)? {
                return Err(ApiError::bad_request(
                    "unknown_parameter",
                    format!("unknown query parameter `{key}`"),
                ));
            }
        }
        Ok(())
    }
}

/// A filter given more than once where it may be given once.
pub fn repeated(key: &str) -> ApiError {
    ApiError::bad_request("invalid_filter", format!("`{key}` may be given once"))
}

/// A filter whose value is not what it must be.
pub fn invalid(key: &str, what: &str) -> ApiError {
    ApiError::bad_request("invalid_filter", format!("`{key}` must be {what}"))
}

/// A page as clients see it.
#[derive(Debug, Serialize)]
pub struct List<T> {
    /// The rows, newest first.
    pub data: Vec<T>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl<T> List<T> {
    /// The page, its rows made into what clients see.
    pub fn of<R>(page: Page<R>, f: impl FnMut(R) -> T) -> Self {
        Self {
            data: page.rows.into_iter().map(f).collect(),
            next_cursor: page.next.map(|c| c.encode()),
        }
    }
}
