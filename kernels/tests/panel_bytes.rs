//! The count of packed panel bytes alive, which the 512-bit decode kernel weighs against the L3 to choose its
//! prefetch stream. Alone in its test binary, so that no other test packs or drops panels meanwhile.

use infer_kernels::GgmlType;
use infer_kernels::packed::{self, PackJob};
use infer_kernels::quant::{BlockQ8_0, blocks_as_bytes};

#[test]
fn panel_bytes_count_packed_matrices_while_they_live() {
    assert_eq!(packed::panel_bytes_alive(), 0, "no panels before the first pack");
    let (rows, cols) = (64, 256);
    let blocks = vec![BlockQ8_0::default(); rows * cols / 32];
    let bytes = blocks_as_bytes(&blocks);
    let one = packed::pack(GgmlType::Q8_0, bytes, rows, cols).expect("packable");
    let single = packed::panel_bytes_alive();
    // The panels hold every source byte (the f16 scales as f32 and offsets, at least), in whole lines.
    assert!(single >= bytes.len() && single.is_multiple_of(64), "{single} bytes for a {}-byte matrix", bytes.len());
    // Matrices packed together share one buffer, counted once, until the last of them goes.
    let job = PackJob { ty: GgmlType::Q8_0, data: bytes, rows, cols };
    let mut two = packed::pack_all(&[job, job], |_, _| {});
    assert_eq!(packed::panel_bytes_alive(), 3 * single);
    let second = two.pop().flatten().expect("packable");
    drop(two);
    assert_eq!(packed::panel_bytes_alive(), 3 * single, "the shared buffer lives while one matrix holds it");
    drop(second);
    assert_eq!(packed::panel_bytes_alive(), single);
    drop(one);
    assert_eq!(packed::panel_bytes_alive(), 0);
}
