"""MUR inside LangChain apps: `ChatMUR`, the graph as a chat model, and `mur_tool`, it as an
agent's tool (chat_model.py); `MURMiddleware`, MUR's gate over a `create_agent` agent's own
model calls (middleware.py); and the one reading of a conversation and writing of a reply that
ChatMUR and the OpenAI-compatible endpoint share (chat.py). A later LangChain integration goes
here. Apps import them from `mur` itself.
"""
