//! Keys and values of `__consumer_offsets` in Kafka's schemas, as the group coordinator reads
//! them when it loads a partition: the first byte picks the decoder, the rest is its input.
#![no_main]

use gregor_broker::group_coordinator::records as r;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, input @ ..] = data else {
        return;
    };
    match which % 10 {
        0 => drop(r::decode_key(input)),
        1 => drop(r::decode_offset_commit_value(input)),
        2 => drop(r::decode_group_metadata_value(input)),
        3 => drop(r::decode_consumer_group_metadata_value(input)),
        4 => drop(r::decode_consumer_group_partition_metadata_value(input)),
        5 => drop(r::decode_consumer_group_member_metadata_value(input)),
        6 => drop(r::decode_consumer_group_target_assignment_metadata_value(
            input,
        )),
        7 => drop(r::decode_consumer_group_target_assignment_member_value(
            input,
        )),
        8 => drop(r::decode_consumer_group_current_member_assignment_value(
            input,
        )),
        _ => drop(r::subscription_topics(input)),
    }
});
