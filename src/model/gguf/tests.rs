//! Reader/writer tests: round trips (property-based), and a table of malformed files each of
//! which must give its own specific error, never a panic.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::gpu::quant::GgmlType;

fn write_to_vec(meta: &[(String, Value)], tensors: &[(TensorSpec, Vec<u8>)]) -> Vec<u8> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), meta, &specs).expect("header");
    for (_, data) in tensors {
        w.write_tensor(data).expect("tensor");
    }
    w.finish().expect("finish")
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(Path::new("test.gguf"), bytes.to_vec())
}

fn problem(bytes: &[u8]) -> Problem {
    match parse(bytes) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => e.problem().cloned().expect("a malformed-file error"),
    }
}

type Metadata = Vec<(String, Value)>;
type Tensors = Vec<(TensorSpec, Vec<u8>)>;

fn sample() -> (Metadata, Tensors) {
    let meta = vec![
        ("general.architecture".to_string(), Value::from("llama")),
        ("llama.block_count".to_string(), Value::U32(2)),
        (
            "tokenizer.ggml.tokens".to_string(),
            string_array(&["a", "b", "ü"]),
        ),
    ];
    let tensors = vec![
        (
            TensorSpec::new("w", &[4, 2], GgmlType::F32),
            (0..32).map(|i| i as u8).collect(),
        ),
        (TensorSpec::new("q", &[32], GgmlType::Q8_0), vec![7u8; 34]),
    ];
    (meta, tensors)
}

#[test]
fn writes_and_reads_back() {
    let (meta, tensors) = sample();
    let bytes = write_to_vec(&meta, &tensors);
    let f = parse(&bytes).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata(), &meta[..]);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count"), Some(2));
    assert_eq!(f.tensors().len(), 2);
    for (spec, data) in &tensors {
        let t = f.tensor(&spec.name).unwrap();
        assert_eq!(t.dims, spec.dims);
        assert_eq!(t.ty, spec.ty);
        assert_eq!(f.tensor_data(t), &data[..]);
        assert_eq!((f.data_offset() + t.offset) % 32, 0);
    }
}

/// Byte offset of the first tensor info (after the metadata) in the sample file.
fn sample_bytes() -> Vec<u8> {
    let (meta, tensors) = sample();
    write_to_vec(&meta, &tensors)
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("pattern in sample file")
}

/// Position of tensor info `name`'s n_dims field.
fn tensor_info_at(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    find(bytes, &pat) + pat.len()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_bytes();
    // Padding after the last tensor's data is optional: the file may end where that data ends.
    let f = parse(&bytes).unwrap();
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.size)
        .max()
        .unwrap() as usize;
    assert!(parse(&bytes[..data_end]).is_ok());
    for len in 0..data_end {
        let e = parse(&bytes[..len]).err();
        let e = e.unwrap_or_else(|| panic!("truncated to {len} bytes was accepted"));
        let p = e.problem().cloned().expect("malformed");
        assert!(
            matches!(
                p,
                Problem::Truncated { .. }
                    | Problem::CountTooLarge { .. }
                    | Problem::DataOutOfBounds { .. }
            ),
            "len {len}: {p:?}"
        );
        // Errors name the file and an offset inside it.
        let msg = e.to_string();
        assert!(msg.starts_with("test.gguf: "), "{msg}");
    }
}

#[test]
fn malformed_files_give_specific_errors() {
    let good = sample_bytes();
    let w_dims = tensor_info_at(&good, "w"); // n_dims (u32), dims, type (u32), offset (u64)
    let q_dims = tensor_info_at(&good, "q");
    let tokens_key = find(&good, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len();

    type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Mutation, Problem)> = vec![
        (
            "wrong magic",
            Box::new(|b| b[0..4].copy_from_slice(b"GGML")),
            Problem::BadMagic(*b"GGML"),
        ),
        (
            "version 1",
            Box::new(|b| put_u32(b, 4, 1)),
            Problem::UnsupportedVersion(1),
        ),
        (
            "huge tensor count",
            Box::new(|b| put_u64(b, 8, u64::MAX)),
            Problem::CountTooLarge {
                count: u64::MAX,
                max: (good.len() as u64 - 16) / 32,
            },
        ),
        (
            "unknown value type",
            Box::new(move |b| put_u32(b, tokens_key, 99)),
            Problem::UnknownValueType(99),
        ),
        (
            "huge array count",
            Box::new(move |b| put_u64(b, tokens_key + 8, 1 << 60)),
            Problem::CountTooLarge {
                count: 1 << 60,
                max: (good.len() - tokens_key - 16) as u64 / 8,
            },
        ),
        (
            "unknown tensor type",
            Box::new(move |b| put_u32(b, w_dims + 4 + 16, 4)),
            Problem::UnknownTensorType(4),
        ),
        (
            "too many dims",
            Box::new(move |b| put_u32(b, w_dims, 5)),
            Problem::TooManyDims(5),
        ),
        (
            "zero dim",
            Box::new(move |b| put_u64(b, w_dims + 4, 0)),
            Problem::ZeroDim,
        ),
        (
            "dims overflow",
            Box::new(move |b| {
                put_u64(b, w_dims + 4, 1 << 40);
                put_u64(b, w_dims + 12, 1 << 40);
            }),
            Problem::SizeOverflow,
        ),
        (
            "not whole blocks",
            Box::new(move |b| put_u64(b, q_dims + 4, 33)),
            Problem::NotWholeBlocks {
                type_name: "Q8_0",
                ne0: 33,
                block: 32,
            },
        ),
        (
            "misaligned offset",
            Box::new(move |b| put_u64(b, q_dims + 4 + 8 + 4, 33)),
            Problem::Misaligned {
                offset: 33,
                alignment: 32,
            },
        ),
        (
            "offset past the end",
            Box::new(move |b| put_u64(b, q_dims + 4 + 8 + 4, 1 << 20)),
            Problem::DataOutOfBounds {
                end: 0, // checked by kind below
                file_len: 0,
            },
        ),
        (
            "duplicate tensor",
            Box::new(move |b| {
                let at = tensor_info_at(b, "q") - 1;
                b[at] = b'w';
            }),
            Problem::DuplicateTensor("w".into()),
        ),
        (
            "invalid utf-8 key",
            Box::new(|b| {
                let at = find(b, b"general.architecture");
                b[at] = 0xFF;
            }),
            Problem::InvalidUtf8,
        ),
    ];
    for (what, mutate, expected) in cases {
        let mut b = good.clone();
        mutate(&mut b);
        let got = problem(&b);
        let same = match (&got, &expected) {
            (Problem::DataOutOfBounds { .. }, Problem::DataOutOfBounds { .. }) => true,
            _ => got == expected,
        };
        assert!(same, "{what}: expected {expected:?}, got {got:?}");
    }
}

#[test]
fn bad_alignment_and_duplicate_keys() {
    let (_, tensors) = sample();
    // Alignment 3: write the file with a valid alignment, then patch the value.
    let meta = vec![("general.alignment".to_string(), Value::U32(64))];
    let mut b = write_to_vec(&meta, &tensors);
    let at = find(&b, b"general.alignment") + "general.alignment".len() + 4;
    put_u32(&mut b, at, 3);
    assert!(matches!(problem(&b), Problem::BadAlignment(_)));

    let meta = vec![
        ("a.key".to_string(), Value::U32(1)),
        ("b.key".to_string(), Value::U32(2)),
    ];
    let mut b = write_to_vec(&meta, &tensors);
    let at = find(&b, b"b.key");
    b[at] = b'a';
    assert_eq!(problem(&b), Problem::DuplicateKey("a.key".into()));
}

#[test]
fn custom_alignment_is_honoured() {
    let (_, tensors) = sample();
    let meta = vec![("general.alignment".to_string(), Value::U32(256))];
    let f = parse(&write_to_vec(&meta, &tensors)).unwrap();
    assert_eq!(f.alignment(), 256);
    for t in f.tensors() {
        assert_eq!((f.data_offset() + t.offset) % 256, 0);
    }
}

#[test]
fn deep_nesting_is_refused() {
    let mut v = Value::U8(1);
    for _ in 0..(MAX_ARRAY_DEPTH + 1) {
        v = Value::Array(Array {
            ty: v.ty(),
            items: vec![v],
        });
    }
    let b = write_to_vec(&[("deep".to_string(), v)], &[]);
    assert_eq!(problem(&b), Problem::NestingTooDeep);
}

#[test]
fn version_2_is_read() {
    let mut b = sample_bytes();
    put_u32(&mut b, 4, 2);
    assert_eq!(parse(&b).unwrap().version(), 2);
}

#[test]
fn writer_refuses_inconsistent_input() {
    let spec = TensorSpec::new("x", &[33], GgmlType::Q8_0);
    assert!(GgufWriter::new(Vec::new(), &[], &[spec]).is_err());
    let spec = TensorSpec::new("x", &[4], GgmlType::F32);
    let mut w = GgufWriter::new(Vec::new(), &[], std::slice::from_ref(&spec)).unwrap();
    assert!(w.write_tensor(&[0; 15]).is_err());
    let w = GgufWriter::new(Vec::new(), &[], &[spec]).unwrap();
    assert!(w.finish().is_err(), "a missing tensor must be reported");
}

fn arb_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<f32>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::F64),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    arb_scalar().prop_recursive(2, 24, 6, |inner| {
        // Arrays are homogeneous: build one from a kind of item repeated.
        (inner, 0usize..6).prop_map(|(v, n)| {
            Value::Array(Array {
                ty: v.ty(),
                items: vec![v; n],
            })
        })
    })
}

fn arb_type() -> impl Strategy<Value = GgmlType> {
    prop::sample::select(GgmlType::all().collect::<Vec<_>>())
}

proptest! {
    #[test]
    fn round_trip(
        meta in prop::collection::vec(("[a-z.]{1,10}", arb_value()), 0..6),
        shapes in prop::collection::vec((arb_type(), 1u64..3, 1u64..4), 0..5),
    ) {
        let mut seen = std::collections::HashSet::new();
        let meta: Vec<(String, Value)> = meta
            .into_iter()
            .filter(|(k, _)| k != "general.alignment" && seen.insert(k.clone()))
            .collect();
        let tensors: Vec<(TensorSpec, Vec<u8>)> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(ty, blocks, rows))| {
                let spec = TensorSpec::new(
                    format!("t{i}"),
                    &[blocks * ty.block_len() as u64, rows],
                    ty,
                );
                let size = spec.size().unwrap() as usize;
                let data = (0..size).map(|j| (j * 31 + i) as u8).collect();
                (spec, data)
            })
            .collect();
        let f = parse(&write_to_vec(&meta, &tensors)).unwrap();
        prop_assert_eq!(f.metadata(), &meta[..]);
        for (spec, data) in &tensors {
            let t = f.tensor(&spec.name).unwrap();
            prop_assert_eq!(&t.dims, &spec.dims);
            prop_assert_eq!(t.ty, spec.ty);
            prop_assert_eq!(f.tensor_data(t), &data[..]);
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.extend_from_slice(&bytes);
        let _ = parse(&b);
    }
}
