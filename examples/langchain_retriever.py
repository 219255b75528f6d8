"""ReMem as a LangChain retriever (pip install -e ".[langchain]"). Runs offline: hash embedder, temp store.

python examples/langchain_retriever.py
"""

import tempfile

from remem_agent import ReMem
from remem_agent.integrations.langchain import ReMemRetriever

with tempfile.TemporaryDirectory() as folder, ReMem(folder) as mem:
    mem.add("The customer is on the Basic plan.", entity="customer", attribute="plan")
    mem.add("The customer upgraded to the Pro plan.", entity="customer", attribute="plan")  # supersedes Basic
    mem.add("The customer prefers email over phone calls.", entity="customer", attribute="contact", role="preference")
    mem.add("Refunds are processed within 5 business days.", role="note")

    retriever = ReMemRetriever(memory=mem, k=3, task="support")
    docs = retriever.invoke("Which plan is the customer on?")
    for doc in docs:
        m = doc.metadata
        print(f"{m['score']:.3f} {m['state']:<8} {m['role']:<10} {doc.page_content}")

    # The answer relied on the top document: tell ReMem, so ranking learns what helps.
    receipt = retriever.feedback(success=True, used_ids=[docs[0].metadata["id"]])
    print(f"feedback success={receipt.success} credited={sorted(receipt.credit.values(), reverse=True)[:1]}")

    # A retriever is a LangChain Runnable: it composes with | like any other.
    context = retriever | (lambda ds: "\n".join(d.page_content for d in ds))
    print("context:", context.invoke("How does the customer want to be contacted?").replace("\n", " | "))
    retriever.feedback(success=True)  # feedback for that last search, no memory singled out
