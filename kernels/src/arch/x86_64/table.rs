//! The level's [`crate::dispatch::Kernels`] table: safe wrappers around the `#[target_feature]` kernels, named by
//! `x86_kernels!` for each level.

macro_rules! x86_table {
    (
        features = $feat:literal,
        isa = $isa:expr,
        packed = $packed:expr,
        packed_f = $packed_f:expr,
        packed_formats = $pf:expr,
        attention = [$dc32:ident, $dc16:ident, $ar32:ident, $ar16:ident, $cvt:ident],
        quantize32 = $q32:ident,
        task_rows = $task_rows:expr
    ) => {
        /// This level's table. Only [`crate::dispatch`] hands it out, after checking the CPU has every feature in
        /// the target-feature string: that check is the safety argument of every wrapper below.
        pub(crate) static KERNELS: Kernels = Kernels {
            isa: $isa,
            dot_f32: |a, b| {
                // SAFETY: see KERNELS.
                unsafe { dot_f32(a, b) }
            },
            axpy_f32: |alpha, x, y| {
                // SAFETY: see KERNELS.
                unsafe { axpy_f32(alpha, x, y) }
            },
            scale_f32: |alpha, y| {
                // SAFETY: see KERNELS.
                unsafe { scale_f32(alpha, y) }
            },
            dot_f16: |a, b| {
                // SAFETY: see KERNELS.
                unsafe { dot_f16(a, b) }
            },
            axpy_f16: |alpha, x, y| {
                // SAFETY: see KERNELS.
                unsafe { axpy_f16(alpha, x, y) }
            },
            f32: |w, cols, rows, x, n, out| {
                // SAFETY: see KERNELS.
                unsafe { panel_f::<f32>(w, cols, rows, x, n, out) }
            },
            f16: |w, cols, rows, x, n, out| {
                // SAFETY: see KERNELS.
                unsafe { panel_f::<f16>(w, cols, rows, x, n, out) }
            },
            q8_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ8_0>(w, nb, rows, act, n, g, out) }
            },
            q4_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ4_0>(w, nb, rows, act, n, g, out) }
            },
            q4_1: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ4_1>(w, nb, rows, act, n, g, out) }
            },
            q5_0: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panel32::<BlockQ5_0>(w, nb, rows, act, n, g, out) }
            },
            q2_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ2K>(w, nb, rows, act, n, g, out) }
            },
            q4_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ4K>(w, nb, rows, act, n, g, out) }
            },
            q6_k: |w, nb, rows, act, n, g, out| {
                // SAFETY: see KERNELS.
                unsafe { panelk::<BlockQ6K>(w, nb, rows, act, n, g, out) }
            },
            packed: $packed,
            packed_f: $packed_f,
            packed_formats: $pf,
            dot_cols_f32: |q, kt, lanes, out| {
                // SAFETY: see KERNELS.
                unsafe { $dc32(q, kt, lanes, out) }
            },
            dot_cols_f16: |q, kt, lanes, out| {
                // SAFETY: see KERNELS.
                unsafe { $dc16(q, kt, lanes, out) }
            },
            axpy_rows_f32: |a, v, out| {
                // SAFETY: see KERNELS.
                unsafe { $ar32(a, v, out) }
            },
            axpy_rows_f16: |a, v, out| {
                // SAFETY: see KERNELS.
                unsafe { $ar16(a, v, out) }
            },
            f16_to_f32: |src, dst| {
                // SAFETY: see KERNELS.
                unsafe { $cvt(src, dst) }
            },
            dequant_q8: |q, d, lanes, dst| {
                // SAFETY: see KERNELS.
                unsafe { dequant_q8(q, d, lanes, dst) }
            },
            softmax_block: |x, scale, state| {
                // SAFETY: see KERNELS.
                unsafe { softmax_block(x, scale, state) }
            },
            swiglu: |g, u| {
                // SAFETY: see KERNELS.
                unsafe { swiglu(g, u) }
            },
            geglu: |g, u| {
                // SAFETY: see KERNELS.
                unsafe { geglu(g, u) }
            },
            quantize32: |x, g, q, d, s, i| {
                // SAFETY: see KERNELS.
                unsafe { $q32(x, g, q, d, s, i) }
            },
            quantize_k: |x, g, out| {
                // SAFETY: see KERNELS.
                unsafe { quantize_k(x, g, out) }
            },
            task_rows: $task_rows,
        };
    };
}
