//! Every request type at every version the broker advertises: the first byte picks the API
//! (among those `supported_versions` accepts), the second the version inside its range, the
//! rest is the body. A body that decodes must re-encode to bytes that decode and encode to the
//! same bytes again.
#![no_main]

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind};
use libfuzzer_sys::fuzz_target;

fn advertised() -> &'static [(ApiKey, i16, i16)] {
    static KEYS: OnceLock<Vec<(ApiKey, i16, i16)>> = OnceLock::new();
    KEYS.get_or_init(|| {
        ApiKey::iter()
            .filter_map(|k| {
                gregor_broker::handlers::supported_versions(k).map(|(min, max)| (k, min, max))
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let [k, v, body @ ..] = data else {
        return;
    };
    let keys = advertised();
    let (api_key, min, max) = keys[usize::from(*k) % keys.len()];
    let span = i32::from(max) - i32::from(min) + 1;
    let version = (i32::from(min) + i32::from(*v) % span) as i16;
    let mut buf = Bytes::copy_from_slice(body);
    let Ok(req) = RequestKind::decode(api_key, &mut buf, version) else {
        return;
    };
    let mut out = BytesMut::new();
    if req.encode(&mut out, version).is_err() {
        return;
    }
    let first = out.freeze();
    let mut again = first.clone();
    let back = match RequestKind::decode(api_key, &mut again, version) {
        Ok(b) => b,
        Err(e) => panic!("{api_key:?} v{version}: a re-encoded request does not decode: {e:#}"),
    };
    // Compared as bytes, not values: a float field may hold NaN.
    let mut second = BytesMut::new();
    back.encode(&mut second, version)
        .expect("a decoded re-encoded request encodes");
    assert_eq!(
        first,
        second.freeze(),
        "{api_key:?} v{version}: encodings differ"
    );
});
