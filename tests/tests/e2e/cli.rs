//! `spool-api openapi` prints the document `GET /openapi.json` serves.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use spool_tests::Process;

use crate::stack::Stack;

#[tokio::test]
async fn spool_api_openapi_prints_the_served_document() {
    let mut printer = Process::spawn("spool-api", &["openapi"], &HashMap::new()).expect("spawn");
    let code = printer.wait(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{}", printer.output());
    let printed: Value = serde_json::from_str(&printer.output()).expect("the document, as JSON");
    assert_eq!(printed["openapi"], "3.1.0");
    let stack = Stack::start().await;
    let (status, served) = stack.get_json("/openapi.json").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(printed, served);
}
