//! Which type each tensor gets: the requested type, except where the policy keeps more precision or the tensor's
//! rows do not fit the type's blocks.

use infer_kernels::GgmlType;

use crate::gguf::TensorInfo;

/// The types `infer quantize` writes, by the names it accepts (lower case, as on its command line).
pub const TARGETS: [(&str, GgmlType); 10] = [
    ("f32", GgmlType::F32),
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("q8_0", GgmlType::Q8_0),
    ("q6_k", GgmlType::Q6_K),
    ("q5_0", GgmlType::Q5_0),
    ("q4_1", GgmlType::Q4_1),
    ("q4_0", GgmlType::Q4_0),
    ("q4_k", GgmlType::Q4_K),
    ("q2_k", GgmlType::Q2_K),
];

/// Parses a target type name (case-insensitive).
pub fn parse_target(name: &str) -> Option<GgmlType> {
    TARGETS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, t)| t)
}

/// The type a tensor falls back to when its rows are not a whole number of the requested type's blocks: the
/// 256-value K-quants go to a 32-value type of at least their size (llama-quantize's choice too), and anything
/// whose rows are not a multiple of 32 either is stored as F16.
pub fn fallback(ty: GgmlType, row_len: u64) -> GgmlType {
    if row_len.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let next = match ty {
        GgmlType::Q2_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if row_len.is_multiple_of(next.block_size() as u64) { next } else { GgmlType::F16 }
}

/// `general.file_type` (llama.cpp's `llama_ftype`) for a file mostly of type `ty`.
pub fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q2_K => 10,
        // "Q4_K_S": mostly Q4_K.
        GgmlType::Q4_K => 14,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        _ => 0,
    }
}

/// Bits per weight of a type (its block's bytes over its values).
pub fn bits_per_weight(ty: GgmlType) -> f64 {
    ty.type_size() as f64 * 8.0 / ty.block_size() as f64
}

/// How the types are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The requested type.
    pub target: GgmlType,
    /// Every 2-D tensor gets `target` (llama-quantize `--pure`): no extra precision for the embedding or head.
    pub pure: bool,
    /// Type of `token_embd.weight`, overriding the policy.
    pub token_embedding: Option<GgmlType>,
    /// Type of the output projection (`output.weight`, or `token_embd.weight` when the model ties them), overriding
    /// the policy.
    pub output: Option<GgmlType>,
}

/// Why a tensor got the type it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The requested type.
    Target,
    /// 1-D tensors (norms, biases) stay F32.
    Vector,
    /// The output projection keeps more precision (the policy without `--pure`).
    OutputHead,
    /// `--token-embedding-type` or `--output-tensor-type`.
    Override,
    /// Tensors that are neither float nor quantized (integer tables) are copied as they are.
    Copied,
}

/// One tensor's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    /// Index in the input file's tensor list.
    pub index: usize,
    pub name: String,
    pub dims: Vec<u64>,
    pub from: GgmlType,
    /// The type chosen before checking the rows.
    pub wanted: GgmlType,
    /// The type written (`wanted`, or its [`fallback`]).
    pub to: GgmlType,
    pub reason: Reason,
}

impl TensorPlan {
    pub fn fell_back(&self) -> bool {
        self.wanted != self.to
    }
}

impl Policy {
    /// The plan for every tensor of a file, in file order.
    pub fn plan(&self, tensors: &[TensorInfo]) -> Vec<TensorPlan> {
        let tied = !tensors.iter().any(|t| t.name == "output.weight");
        tensors
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let is_output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
                let table =
                    matches!(t.ty, GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64 | GgmlType::F64);
                let (wanted, reason) = if table {
                    (t.ty, Reason::Copied)
                } else if t.n_rows() <= 1 || t.dims.len() < 2 {
                    (GgmlType::F32, Reason::Vector)
                } else if let Some(ty) = self.output.filter(|_| is_output) {
                    (ty, Reason::Override)
                } else if let Some(ty) = self.token_embedding.filter(|_| t.name == "token_embd.weight") {
                    (ty, Reason::Override)
                } else if is_output && !self.pure && bits_per_weight(self.target) < 8.0 {
                    (GgmlType::Q8_0, Reason::OutputHead)
                } else {
                    (self.target, Reason::Target)
                };
                let to = if reason == Reason::Copied { wanted } else { fallback(wanted, t.ne0()) };
                TensorPlan { index, name: t.name.clone(), dims: t.dims.clone(), from: t.ty, wanted, to, reason }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dims: &[u64], ty: GgmlType) -> TensorInfo {
        let n_elements = dims.iter().product();
        TensorInfo { name: name.into(), dims: dims.to_vec(), ty, offset: 0, n_elements, n_bytes: 0 }
    }

    fn tensors(tied: bool) -> Vec<TensorInfo> {
        let mut t = vec![
            info("token_embd.weight", &[576, 1000], GgmlType::F32),
            info("blk.0.attn_norm.weight", &[576], GgmlType::F32),
            info("blk.0.attn_q.weight", &[576, 576], GgmlType::F32),
            info("blk.0.ffn_down.weight", &[1536, 576], GgmlType::F16),
        ];
        if !tied {
            t.push(info("output.weight", &[576, 1000], GgmlType::F32));
        }
        t
    }

    fn types(plan: &[TensorPlan]) -> Vec<(GgmlType, Reason)> {
        plan.iter().map(|p| (p.to, p.reason)).collect()
    }

    #[test]
    fn default_keeps_the_head_at_q8_0_and_vectors_f32() {
        use GgmlType::*;
        let p = Policy { target: Q4_0, pure: false, token_embedding: None, output: None };
        // Tied: the embedding is the head.
        assert_eq!(
            types(&p.plan(&tensors(true))),
            [(Q8_0, Reason::OutputHead), (F32, Reason::Vector), (Q4_0, Reason::Target), (Q4_0, Reason::Target)]
        );
        // Untied: the head is output.weight, the embedding gets the target.
        let plan = p.plan(&tensors(false));
        assert_eq!((plan[0].to, plan[4].to), (Q4_0, Q8_0));
        let pure = Policy { pure: true, ..p };
        assert!(pure.plan(&tensors(true)).iter().all(|t| t.to == if t.dims.len() == 1 { F32 } else { Q4_0 }));
        let q8 = Policy { target: Q8_0, ..p };
        assert_eq!(q8.plan(&tensors(true))[0].reason, Reason::Target);
    }

    #[test]
    fn overrides_and_fallbacks() {
        use GgmlType::*;
        let p = Policy { target: Q2_K, pure: true, token_embedding: Some(Q6_K), output: None };
        let plan = p.plan(&tensors(false));
        // 576-wide rows do not fit 256-value blocks: Q6_K -> Q8_0, Q2_K -> Q4_0; 1536 fits.
        assert_eq!((plan[0].wanted, plan[0].to, plan[0].reason), (Q6_K, Q8_0, Reason::Override));
        assert_eq!((plan[2].to, plan[2].fell_back()), (Q4_0, true));
        assert_eq!((plan[3].to, plan[3].fell_back()), (Q2_K, false));
        let tied_head = Policy { output: Some(F16), ..p };
        assert_eq!(tied_head.plan(&tensors(true))[0].to, F16, "the output override wins for a tied embedding");
        assert_eq!(fallback(Q4_K, 576), Q5_0);
        assert_eq!(fallback(Q4_0, 48), F16);
        assert_eq!(fallback(Q4_K, 512), Q4_K);
    }

    #[test]
    fn names_parse() {
        assert_eq!(parse_target("Q4_K"), Some(GgmlType::Q4_K));
        assert_eq!(parse_target("q3_k"), None);
        assert!(TARGETS.iter().all(|&(_, t)| infer_kernels::quant::can_quantize(t)));
    }
}
