//! A whole request frame (after the 4-byte size prefix): header, then body, decoded at the
//! versions the broker advertises (`gregor_broker::handlers::supported_versions`), as the
//! connection task does. Must never panic or allocate beyond what the frame can back.
#![no_main]

use bytes::{Bytes, BytesMut};
use gregor_protocol::frame::{decode_request, DecodedRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frame = Bytes::copy_from_slice(data);
    if let Ok(DecodedRequest::Request { header, body, .. }) =
        decode_request(frame, &gregor_broker::handlers::supported_versions)
    {
        // Whatever decodes must encode again at its version (handlers echo fields back).
        let mut out = BytesMut::new();
        let _ = body.encode(&mut out, header.request_api_version);
    }
});
