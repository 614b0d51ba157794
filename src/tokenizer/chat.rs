//! Chat templates (placeholder while the tokenizer core lands).
#[derive(Debug, Clone)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}
#[derive(Debug)]
pub struct ChatTemplate;
#[derive(Debug, thiserror::Error)]
#[error("template")]
pub struct TemplateError;
