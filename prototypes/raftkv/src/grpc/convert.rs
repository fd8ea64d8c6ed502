//! etcd's protobuf messages to [`crate::kv`]'s values and back: the one
//! translation both the gRPC services and the JSON gateway use.

use crate::kv;
use etcd_api::etcdserverpb as pb;
use etcd_api::mvccpb;
use tonic::Status;

/// A request's enum field out of its range.
fn bad_enum(what: &str, v: i32) -> Status {
    Status::invalid_argument(format!("etcdserver: unknown {what} {v}"))
}

/// etcd's `KeyValue` of a stored version.
pub fn kv_out(kv: kv::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

/// A range request.
pub fn range_in(r: pb::RangeRequest) -> Result<kv::RangeRequest, Status> {
    use pb::range_request::{SortOrder as O, SortTarget as T};
    let sort_order = match O::try_from(r.sort_order) {
        Ok(O::None) => kv::SortOrder::None,
        Ok(O::Ascend) => kv::SortOrder::Ascend,
        Ok(O::Descend) => kv::SortOrder::Descend,
        Err(_) => return Err(bad_enum("sort order", r.sort_order)),
    };
    let sort_target = match T::try_from(r.sort_target) {
        Ok(T::Key) => kv::SortTarget::Key,
        Ok(T::Version) => kv::SortTarget::Version,
        Ok(T::Create) => kv::SortTarget::Create,
        Ok(T::Mod) => kv::SortTarget::Mod,
        Ok(T::Value) => kv::SortTarget::Value,
        Err(_) => return Err(bad_enum("sort target", r.sort_target)),
    };
    Ok(kv::RangeRequest {
        key: r.key,
        range_end: r.range_end,
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

/// A range answer under `header`.
pub fn range_out(r: kv::RangeResponse, header: Option<pb::ResponseHeader>) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(kv_out).collect(),
        more: r.more,
        count: r.count,
    }
}

/// A put request.
pub fn put_in(r: pb::PutRequest) -> kv::PutRequest {
    kv::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

/// A put answer under `header`.
pub fn put_out(r: kv::PutResponse, header: Option<pb::ResponseHeader>) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: r.prev_kv.map(kv_out),
    }
}

/// A delete request.
pub fn delete_in(r: pb::DeleteRangeRequest) -> kv::DeleteRangeRequest {
    kv::DeleteRangeRequest {
        key: r.key,
        range_end: r.range_end,
        prev_kv: r.prev_kv,
    }
}

/// A delete answer under `header`.
pub fn delete_out(
    r: kv::DeleteRangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv_out).collect(),
    }
}

/// A comparison. The operand is the union's field that matches the
/// target; if another (or none) is set, the target's zero value, as
/// etcd reads an unset field.
pub fn compare_in(c: pb::Compare) -> Result<kv::Compare, Status> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result) {
        Ok(R::Equal) => kv::CompareResult::Equal,
        Ok(R::Greater) => kv::CompareResult::Greater,
        Ok(R::Less) => kv::CompareResult::Less,
        Ok(R::NotEqual) => kv::CompareResult::NotEqual,
        Err(_) => return Err(bad_enum("compare result", c.result)),
    };
    let u = c.target_union;
    let target = match T::try_from(c.target) {
        Ok(T::Version) => kv::CompareTarget::Version(match u {
            Some(U::Version(v)) => v,
            _ => 0,
        }),
        Ok(T::Create) => kv::CompareTarget::Create(match u {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }),
        Ok(T::Mod) => kv::CompareTarget::Mod(match u {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }),
        Ok(T::Value) => kv::CompareTarget::Value(match u {
            Some(U::Value(v)) => v,
            _ => Vec::new(),
        }),
        Ok(T::Lease) => kv::CompareTarget::Lease(match u {
            Some(U::Lease(v)) => v,
            _ => 0,
        }),
        Err(_) => return Err(bad_enum("compare target", c.target)),
    };
    Ok(kv::Compare {
        result,
        target,
        key: c.key,
        range_end: c.range_end,
    })
}

/// One request of a transaction's branch (an empty one is refused).
fn op_in(op: pb::RequestOp) -> Result<kv::RequestOp, Status> {
    use pb::request_op::Request as R;
    Ok(match op.request {
        Some(R::RequestRange(r)) => kv::RequestOp::Range(range_in(r)?),
        Some(R::RequestPut(r)) => kv::RequestOp::Put(put_in(r)),
        Some(R::RequestDeleteRange(r)) => kv::RequestOp::DeleteRange(delete_in(r)),
        Some(R::RequestTxn(t)) => kv::RequestOp::Txn(txn_in(t)?),
        None => {
            return Err(Status::invalid_argument(
                "etcdserver: a transaction's request is empty",
            ))
        }
    })
}

/// A transaction (its nested ones too).
pub fn txn_in(t: pb::TxnRequest) -> Result<kv::TxnRequest, Status> {
    Ok(kv::TxnRequest {
        compare: t
            .compare
            .into_iter()
            .map(compare_in)
            .collect::<Result<_, _>>()?,
        success: t.success.into_iter().map(op_in).collect::<Result<_, _>>()?,
        failure: t.failure.into_iter().map(op_in).collect::<Result<_, _>>()?,
    })
}

/// A transaction's answer under `header`; the answers inside it carry
/// the same header, as etcd's do.
pub fn txn_out(t: kv::TxnResponse, header: Option<pb::ResponseHeader>) -> pb::TxnResponse {
    use pb::response_op::Response as R;
    let responses = t
        .responses
        .into_iter()
        .map(|r| pb::ResponseOp {
            response: Some(match r {
                kv::ResponseOp::Range(r) => R::ResponseRange(range_out(r, header)),
                kv::ResponseOp::Put(r) => R::ResponsePut(put_out(r, header)),
                kv::ResponseOp::DeleteRange(r) => R::ResponseDeleteRange(delete_out(r, header)),
                kv::ResponseOp::Txn(t) => R::ResponseTxn(txn_out(t, header)),
            }),
        })
        .collect();
    pb::TxnResponse {
        header,
        succeeded: t.succeeded,
        responses,
    }
}

/// etcd's event of a change.
pub fn event_out(e: super::backend::Event) -> mvccpb::Event {
    let kind = match e.kind {
        super::backend::EventKind::Put => mvccpb::event::EventType::Put,
        super::backend::EventKind::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv_out(e.kv)),
        prev_kv: e.prev_kv.map(kv_out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compare_reads_the_operand_that_matches_its_target_or_zero() {
        use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
        let c = |target: T, u: Option<U>| pb::Compare {
            result: R::Greater as i32,
            target: target as i32,
            key: b"k".to_vec(),
            range_end: vec![],
            target_union: u,
        };
        let got = compare_in(c(T::Mod, Some(U::ModRevision(9)))).unwrap();
        assert_eq!(got.target, kv::CompareTarget::Mod(9));
        assert_eq!(got.result, kv::CompareResult::Greater);
        let got = compare_in(c(T::Version, Some(U::ModRevision(9)))).unwrap();
        assert_eq!(got.target, kv::CompareTarget::Version(0));
        let got = compare_in(c(T::Value, Some(U::Value(b"v".to_vec())))).unwrap();
        assert_eq!(got.target, kv::CompareTarget::Value(b"v".to_vec()));
        let mut bad = c(T::Lease, None);
        bad.target = 17;
        assert_eq!(
            compare_in(bad).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn nested_transactions_and_their_answers_translate_whole() {
        use pb::request_op::Request as Q;
        let inner = pb::TxnRequest {
            compare: vec![],
            success: vec![pb::RequestOp {
                request: Some(Q::RequestPut(pb::PutRequest {
                    key: b"a".to_vec(),
                    value: b"1".to_vec(),
                    ..Default::default()
                })),
            }],
            failure: vec![],
        };
        let outer = pb::TxnRequest {
            compare: vec![],
            success: vec![pb::RequestOp {
                request: Some(Q::RequestTxn(inner)),
            }],
            failure: vec![pb::RequestOp { request: None }],
        };
        assert!(
            txn_in(outer.clone()).is_err(),
            "an empty request is refused"
        );
        let mut ok = outer;
        ok.failure.clear();
        let t = txn_in(ok).unwrap();
        let kv::RequestOp::Txn(inner) = &t.success[0] else {
            panic!("{t:?}")
        };
        assert!(matches!(&inner.success[0], kv::RequestOp::Put(p) if p.key == b"a"));
        let answer = kv::TxnResponse {
            succeeded: true,
            responses: vec![kv::ResponseOp::Txn(kv::TxnResponse {
                succeeded: false,
                responses: vec![kv::ResponseOp::Range(kv::RangeResponse {
                    kvs: vec![],
                    more: false,
                    count: 3,
                })],
            })],
        };
        let header = pb::ResponseHeader {
            revision: 5,
            ..Default::default()
        };
        let out = txn_out(answer, Some(header));
        let Some(pb::response_op::Response::ResponseTxn(t)) = &out.responses[0].response else {
            panic!("{out:?}")
        };
        assert!(!t.succeeded);
        assert_eq!(t.header.as_ref().map(|h| h.revision), Some(5));
        let Some(pb::response_op::Response::ResponseRange(r)) = &t.responses[0].response else {
            panic!("{t:?}")
        };
        assert_eq!(r.count, 3);
    }
}
