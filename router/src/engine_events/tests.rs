//! Batches as vLLM 0.32's own encoder wrote them (`msgspec.msgpack.Encoder().encode(
//! KVEventBatch(...))` in the vLLM environment, 2026-12-06), and broken ones.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[b"\x01"*8, b"\x02"*8],
/// parent_block_hash=None, token_ids=list(range(8)), block_size=4, lora_id=None, medium="GPU",
/// lora_name=None, extra_keys=[("salt-a",), None]), BlockRemoved(block_hashes=[b"\x01"*8],
/// medium="GPU"), AllBlocksCleared()])`
const PLAIN: &str = "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c4080101010101010101c4080202020202020202b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980001020304050607aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b6579739291a673616c742d61c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c4080101010101010101a66d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564c0";

/// `KVEventBatch(ts=2.0, events=[BlockStored(block_hashes=[b"\x03"*8],
/// parent_block_hash=b"\x02"*8, token_ids=[8, 9, 10, -1], block_size=4, lora_id=1,
/// medium="GPU", lora_name="sql-lora", extra_keys=[("sql-lora",)])], data_parallel_rank=0)`
const LORA: &str = "93cb40000000000000009189a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c4080303030303030303b1706172656e745f626c6f636b5f68617368c4080202020202020202a9746f6b656e5f6964739408090affaa626c6f636b5f73697a6504a76c6f72615f696401a66d656469756da3475055a96c6f72615f6e616d65a873716c2d6c6f7261aa65787472615f6b6579739191a873716c2d6c6f726100";

fn h(b: u8) -> BlockHash {
    BlockHash::Bytes(vec![b; 8])
}

#[test]
fn vllms_own_batches_read_back() {
    assert_eq!(
        decode_batch(&hex(PLAIN)).unwrap(),
        [
            EngineEvent::Stored {
                hashes: vec![h(1), h(2)],
                parent: None,
                tokens: (0..8).collect(),
                block_size: 4,
                lora_name: None,
                salt: Some("salt-a".into()),
            },
            EngineEvent::Removed { hashes: vec![h(1)] },
            EngineEvent::Cleared,
        ]
    );
    assert_eq!(
        decode_batch(&hex(LORA)).unwrap(),
        [EngineEvent::Stored {
            hashes: vec![h(3)],
            parent: Some(h(2)),
            tokens: vec![8, 9, 10, -1],
            block_size: 4,
            lora_name: Some("sql-lora".into()),
            salt: None,
        }]
    );
}

#[test]
fn broken_batches_say_what_is_wrong() {
    let plain = hex(PLAIN);
    // cut anywhere: an error, never a panic
    for n in 0..plain.len() {
        assert!(decode_batch(&plain[..n]).is_err(), "cut at {n}");
    }
    assert_eq!(
        decode_batch(&[0x91, 0xc0]),
        Err(EventError::Shape("a batch is [ts, events, rank]"))
    );
    // an event of a type this build does not know is skipped; one without a type is refused
    let unknown = [
        0x93, 0x00, 0x91, 0x81, 0xa4, b't', b'y', b'p', b'e', 0xa3, b'N', b'e', b'w', 0xc0,
    ];
    assert_eq!(decode_batch(&unknown), Ok(vec![]));
    let untyped = [0x93, 0x00, 0x91, 0x80, 0xc0];
    assert_eq!(
        decode_batch(&untyped),
        Err(EventError::Shape("an event without its type"))
    );
    // tokens that are not the blocks'
    let short = PLAIN.replace("980001020304050607", "9700010203040506");
    assert_eq!(
        decode_batch(&hex(&short)),
        Err(EventError::Shape("BlockStored's tokens are not its blocks'"))
    );
}
