//! A few encodings pinned byte for byte, and the JSON mapping etcd's
//! gateway uses: what a wrong field number or name would change.

use etcd_api::etcdserverpb::{
    compare, request_op, CompactionRequest, Compare, PutRequest, RangeRequest, RequestOp,
    ResponseHeader, TxnRequest, WatchCreateRequest, WatchResponse,
};
use etcd_api::mvccpb::{event::EventType, Event, KeyValue};
use prost::Message;

#[test]
fn a_put_is_encoded_with_etcds_field_numbers() {
    let put = PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 5,
        prev_kv: true,
        ignore_value: false,
        ignore_lease: true,
    };
    // key = 1 (bytes), value = 2 (bytes), lease = 3 (varint),
    // prev_kv = 4, ignore_lease = 6.
    let want = [0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 5, 0x20, 1, 0x30, 1];
    assert_eq!(put.encode_to_vec(), want);
    assert_eq!(PutRequest::decode(&want[..]).unwrap(), put);
}

#[test]
fn a_compare_puts_its_range_end_at_64_and_its_operand_in_the_union() {
    let c = Compare {
        result: compare::CompareResult::Greater as i32,
        target: compare::CompareTarget::Mod as i32,
        key: b"a".to_vec(),
        range_end: b"b".to_vec(),
        target_union: Some(compare::TargetUnion::ModRevision(7)),
    };
    // result = 1, target = 2, key = 3, mod_revision = 6, range_end = 64
    // (tag 64 << 3 | 2 = 514: the varint 0x82 0x04).
    let want = [
        0x08, 1, 0x10, 2, 0x1a, 1, b'a', 0x30, 7, 0x82, 0x04, 1, b'b',
    ];
    assert_eq!(c.encode_to_vec(), want);
    let txn = TxnRequest {
        compare: vec![c],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest::default())),
        }],
        failure: vec![],
    };
    let back = TxnRequest::decode(&txn.encode_to_vec()[..]).unwrap();
    assert_eq!(back, txn);
}

#[test]
fn watch_events_sit_at_field_11() {
    let w = WatchResponse {
        header: Some(ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 3,
            raft_term: 4,
        }),
        watch_id: 0,
        events: vec![Event {
            r#type: EventType::Delete as i32,
            kv: None,
            prev_kv: None,
        }],
        ..Default::default()
    };
    let bytes = w.encode_to_vec();
    // header (1): cluster_id 1, member_id 2, revision 3, raft_term 4;
    // then events (11 << 3 | 2 = 0x5a): type (1) = DELETE.
    let want = [
        0x0a, 8, 0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4, 0x5a, 2, 0x08, 1,
    ];
    assert_eq!(bytes, want);
}

#[test]
fn the_json_mapping_is_the_gateways() {
    let kv = KeyValue {
        key: b"foo".to_vec(),
        create_revision: 2,
        mod_revision: 9,
        version: 3,
        value: b"bar".to_vec(),
        lease: 0,
    };
    let j = serde_json::to_value(&kv).unwrap();
    assert_eq!(
        j,
        serde_json::json!({
            "key": "Zm9v", "create_revision": "2", "mod_revision": "9",
            "version": "3", "value": "YmFy"
        })
    );
    // The gateway reads numbers or strings, and both spellings of names.
    let r: RangeRequest = serde_json::from_str(
        r#"{"key":"Zm9v","rangeEnd":"AA==","limit":2,"sort_order":"DESCEND"}"#,
    )
    .unwrap();
    assert_eq!(r.key, b"foo");
    assert_eq!(r.range_end, vec![0]);
    assert_eq!(r.limit, 2);
    assert_eq!(r.sort_order, 2);
    let c: CompactionRequest = serde_json::from_str(r#"{"revision":"12"}"#).unwrap();
    assert_eq!(c.revision, 12);
    let w: WatchCreateRequest =
        serde_json::from_str(r#"{"key":"YQ==","filters":["NODELETE"],"prev_kv":true}"#).unwrap();
    assert_eq!(w.filters, vec![1]);
    assert!(w.prev_kv);
}
