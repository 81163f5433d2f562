use super::*;

#[test]
fn kinds_follow_codes_and_kubelet_prefixes() {
    let table = [
        (StatusCode::NotFound, "image not found", CriErrorKind::NotFound, false),
        (StatusCode::Unavailable, "connection refused", CriErrorKind::RuntimeUnavailable, true),
        (StatusCode::DeadlineExceeded, "context deadline exceeded", CriErrorKind::DeadlineExceeded, true),
        (StatusCode::Unauthenticated, "no", CriErrorKind::Unauthorized, false),
        (StatusCode::PermissionDenied, "no", CriErrorKind::Unauthorized, false),
        (StatusCode::ResourceExhausted, "disk full", CriErrorKind::ResourceExhausted, true),
        (StatusCode::Unknown, "RegistryUnavailable: dial tcp: refused", CriErrorKind::RegistryUnavailable, true),
        (StatusCode::Unknown, "SignatureValidationFailed: bad sig", CriErrorKind::SignatureValidationFailed, false),
        (
            StatusCode::Unknown,
            "failed to pull and unpack image \"x\": unexpected status: 401 Unauthorized",
            CriErrorKind::Unauthorized,
            false,
        ),
        (StatusCode::InvalidArgument, "bad", CriErrorKind::InvalidArgument, false),
        (StatusCode::Internal, "boom", CriErrorKind::Other, true),
        (StatusCode::Unknown, "registryunavailable lower case is not the prefix", CriErrorKind::Other, true),
    ];
    for (code, msg, kind, retry) in table {
        let e = CriError::from_status(code, msg);
        assert_eq!(e.kind(), kind, "{code:?} {msg}");
        assert_eq!(e.is_retryable(), retry, "{code:?} {msg}");
    }
}

#[test]
fn display_is_the_kubelet_text() {
    assert_eq!(
        CriError::from_status(StatusCode::NotFound, "no such image").to_string(),
        "rpc error: code = NotFound desc = no such image"
    );
    // Unknown statuses lose their code, as the kubelet's remote client strips it.
    assert_eq!(CriError::from_status(StatusCode::Unknown, "pull failed").to_string(), "pull failed");
    assert_eq!(
        CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp 1.2.3.4:443").to_string(),
        "RegistryUnavailable: dial tcp 1.2.3.4:443"
    );
    assert_eq!(
        CriError::deadline_exceeded().to_string(),
        "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    );
}

#[test]
fn new_keeps_an_existing_prefix_and_round_trips_through_status() {
    let e = CriError::new(CriErrorKind::SignatureValidationFailed, "SignatureValidationFailed: x");
    assert_eq!(e.message(), "SignatureValidationFailed: x");
    for kind in [
        CriErrorKind::NotFound,
        CriErrorKind::RuntimeUnavailable,
        CriErrorKind::DeadlineExceeded,
        CriErrorKind::Unauthorized,
        CriErrorKind::ResourceExhausted,
        CriErrorKind::RegistryUnavailable,
        CriErrorKind::SignatureValidationFailed,
        CriErrorKind::InvalidArgument,
        CriErrorKind::Other,
    ] {
        let e = CriError::new(kind, "detail");
        let status = tonic::Status::from(&e);
        let back = CriError::from(status);
        assert_eq!(back.kind(), kind);
        assert_eq!(back, e);
    }
}

#[test]
fn rpc_names_parse_back() {
    for r in Rpc::ALL {
        assert_eq!(r.name().parse::<Rpc>(), Ok(r));
    }
    assert!("Frobnicate".parse::<Rpc>().is_err());
}
