// The chat page's script: plain JavaScript, no framework, no build step.
// It talks to this server only: POST /v1/chat/completions (streamed), GET /v1/models,
// GET /metrics.
// Images (pasted, dropped or attached) go as OpenAI image_url parts holding data: URLs,
// ahead of the message's text; the server reads them, or answers 400 for a text-only model.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const el = {
    apiKey: $("api-key"),
    system: $("system-prompt"),
    temperature: $("temperature"),
    topP: $("top-p"),
    maxTokens: $("max-tokens"),
    model: $("model-name"),
    messages: $("messages"),
    hint: $("empty-hint"),
    form: $("composer"),
    prompt: $("prompt"),
    attach: $("attach"),
    imageFile: $("image-file"),
    attachments: $("attachments"),
    send: $("send"),
    stop: $("stop"),
    newChat: $("new-chat"),
    status: $("status"),
    running: $("m-running"),
    waiting: $("m-waiting"),
    kv: $("m-kv"),
    tps: $("m-tps"),
    metricsStatus: $("metrics-status"),
  };

  const METRICS_INTERVAL_MS = 1000;
  // The conversation as the API wants it (system prompt excluded: added per request).
  let history = [];
  let modelId = null;
  let inFlight = null; // {controller, stopped}
  // Images waiting in the composer for the next message: [{url, name}], url a data: URL.
  let pending = [];

  // ---- settings kept across reloads (the key only for this tab) ----

  const SAVED = [
    [el.system, "hpi.system"],
    [el.temperature, "hpi.temperature"],
    [el.topP, "hpi.top_p"],
    [el.maxTokens, "hpi.max_tokens"],
  ];
  function restoreSettings() {
    try {
      for (const [input, key] of SAVED) {
        const value = localStorage.getItem(key);
        if (value !== null) input.value = value;
        input.addEventListener("change", () => localStorage.setItem(key, input.value));
      }
      el.apiKey.value = sessionStorage.getItem("hpi.api_key") || "";
      el.apiKey.addEventListener("change", () => {
        sessionStorage.setItem("hpi.api_key", el.apiKey.value);
        loadModel();
      });
    } catch (_) {
      // Storage can be off (private modes); the page works without it.
    }
  }

  function authHeaders() {
    const key = el.apiKey.value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  // ---- errors in words ----

  async function errorFromResponse(response) {
    let detail = "";
    try {
      const text = await response.text();
      try {
        const body = JSON.parse(text);
        const err = body && body.error;
        detail = err ? err.message || JSON.stringify(err) : text;
      } catch (_) {
        detail = text;
      }
    } catch (_) {
      // the body could not be read; the status says enough
    }
    let words = `Error ${response.status}${response.statusText ? " " + response.statusText : ""}`;
    if (detail.length > 500) detail = `${detail.slice(0, 500)}…`;
    if (detail) words += `: ${detail}`;
    if (response.status === 401) words += " (check the API key field in Settings)";
    // The turn comes back to the composer with its images: say what to do with them.
    if (/takes no image input/.test(detail)) {
      words += " (the served model reads text only: remove the image and send again)";
    }
    return words;
  }

  // ---- the message list ----

  function scrollToEnd(force) {
    const box = el.messages;
    const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    if (force || nearEnd) box.scrollTop = box.scrollHeight;
  }

  function addMessage(role, text) {
    el.hint.hidden = true;
    const item = document.createElement("div");
    item.className = `msg ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "error" ? "error" : role;
    const content = document.createElement("span");
    content.className = "content";
    content.textContent = text;
    item.append(who, content);
    if (role === "error") item.setAttribute("role", "alert");
    el.messages.append(item);
    scrollToEnd(true);
    return item;
  }

  // Thumbnails in a message, ahead of its text (the order the model gets them in).
  function showImages(item, images) {
    if (!images.length) return;
    const box = document.createElement("div");
    box.className = "thumbs";
    for (const image of images) {
      const img = document.createElement("img");
      img.src = image.url;
      img.alt = image.name || "image";
      box.append(img);
    }
    item.querySelector(".content").before(box);
  }

  function setMeta(item, text) {
    let meta = item.querySelector(".meta");
    if (!meta) {
      meta = document.createElement("span");
      meta.className = "meta";
      item.append(meta);
    }
    meta.textContent = text;
  }

  function setBusy(busy) {
    el.send.disabled = busy;
    el.stop.disabled = !busy;
  }

  // ---- images in the composer ----

  function renderPending() {
    el.attachments.replaceChildren();
    pending.forEach((image, index) => {
      const thumb = document.createElement("div");
      thumb.className = "thumb";
      thumb.setAttribute("role", "listitem");
      const img = document.createElement("img");
      img.src = image.url;
      img.alt = image.name || "image";
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "remove";
      remove.textContent = "×";
      remove.title = "Remove this image";
      remove.setAttribute("aria-label", `Remove image ${image.name || index + 1}`);
      remove.addEventListener("click", () => {
        pending = pending.filter((other) => other !== image);
        renderPending();
        el.prompt.focus();
      });
      thumb.append(img, remove);
      el.attachments.append(thumb);
    });
    el.attachments.hidden = pending.length === 0;
    // An image alone is a message too: the Send button's form check then lets it go.
    el.prompt.required = pending.length === 0;
  }

  function readAsDataUrl(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  async function addImages(files) {
    const others = [];
    for (const file of files) {
      if (!file.type.startsWith("image/")) {
        others.push(`${file.name || file.type || "a file"} (not an image)`);
        continue;
      }
      try {
        pending.push({ url: await readAsDataUrl(file), name: file.name });
      } catch (err) {
        others.push(`${file.name} (${err.message || err})`);
      }
      renderPending();
    }
    if (others.length) el.status.textContent = `Not attached: ${others.join(", ")}`;
  }

  // The files a paste or drop carries; a paste of text carries none and stays the textarea's.
  function filesOf(transfer) {
    if (!transfer) return [];
    if (transfer.files && transfer.files.length) return [...transfer.files];
    return [...(transfer.items || [])]
      .filter((item) => item.kind === "file")
      .map((item) => item.getAsFile())
      .filter(Boolean);
  }

  // ---- SSE over fetch (EventSource cannot POST or send headers) ----

  async function* sseEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const event = { type: "message", data: [] };
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith("data:")) event.data.push(line.slice(5).replace(/^ /, ""));
          else if (line.startsWith("event:")) event.type = line.slice(6).trim();
        }
        if (event.data.length) yield { type: event.type, data: event.data.join("\n") };
      }
    }
  }

  function numberOrNull(input) {
    const value = input.value.trim();
    if (value === "") return null;
    const n = Number(value);
    return Number.isFinite(n) ? n : null;
  }

  function requestBody() {
    const messages = [];
    const system = el.system.value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...history);
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if (modelId) body.model = modelId;
    const temperature = numberOrNull(el.temperature);
    const topP = numberOrNull(el.topP);
    const maxTokens = numberOrNull(el.maxTokens);
    if (temperature !== null) body.temperature = temperature;
    if (topP !== null) body.top_p = topP;
    if (maxTokens !== null) body.max_tokens = Math.round(maxTokens);
    return body;
  }

  async function send() {
    const text = el.prompt.value;
    const images = pending;
    if ((!text.trim() && !images.length) || inFlight) return;
    el.prompt.value = "";
    pending = [];
    renderPending();
    const userItem = addMessage("user", text);
    showImages(userItem, images);
    // This turn's conversation: New chat swaps `history` for a fresh one mid-answer.
    const conversation = history;
    // A plain string without images, as before; with them, the images come first.
    let userContent = text;
    if (images.length) {
      userContent = images.map((image) => ({ type: "image_url", image_url: { url: image.url } }));
      if (text.trim()) userContent.push({ type: "text", text });
    }
    conversation.push({ role: "user", content: userContent });
    const answer = addMessage("assistant", "");
    answer.classList.add("streaming");
    answer.dataset.state = "waiting";
    const content = answer.querySelector(".content");

    const request = { controller: new AbortController(), stopped: false };
    inFlight = request;
    setBusy(true);
    el.status.textContent = "Waiting for the model…";
    let firstTokenAt = null;
    let lastTokenAt = null;
    let completionTokens = null;
    let finishReason = null;
    let streamError = null;
    let sawDone = false;

    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...authHeaders() },
        body: JSON.stringify(requestBody()),
        signal: request.controller.signal,
      });
      if (!response.ok) throw new Error(await errorFromResponse(response));
      answer.dataset.state = "streaming";
      el.status.textContent = "Generating…";
      for await (const event of sseEvents(response)) {
        if (event.data === "[DONE]") {
          sawDone = true;
          break;
        }
        let chunk;
        try {
          chunk = JSON.parse(event.data);
        } catch (_) {
          continue;
        }
        if (event.type === "error" || chunk.error) {
          const err = chunk.error || chunk;
          streamError = `The server stopped the answer: ${err.message || JSON.stringify(err)}`;
          continue;
        }
        if (chunk.usage) completionTokens = chunk.usage.completion_tokens;
        for (const choice of chunk.choices || []) {
          const delta = (choice.delta && choice.delta.content) || "";
          if (delta) {
            lastTokenAt = performance.now();
            if (firstTokenAt === null) firstTokenAt = lastTokenAt;
            content.textContent += delta;
            scrollToEnd(false);
          }
          if (choice.finish_reason) finishReason = choice.finish_reason;
        }
      }
      if (!sawDone && !streamError) {
        streamError = "The connection closed before the answer was complete.";
      }
    } catch (err) {
      if (!request.stopped) {
        streamError =
          err instanceof TypeError
            ? `Could not reach the server: ${err.message}`
            : String(err.message || err);
      }
    } finally {
      inFlight = null;
      setBusy(false);
      answer.classList.remove("streaming");
    }

    pollMetrics(); // the panel shows the request gone now, not a second later
    if (conversation !== history) return; // New chat was pressed meanwhile: nothing to keep

    const partial = content.textContent;
    answer.dataset.state = request.stopped ? "stopped" : streamError ? "error" : "done";
    if (request.stopped) finishReason = "stopped";
    if (!partial && (request.stopped || streamError)) {
      // Nothing came back: take the turn out, its text back in the box to send again.
      conversation.pop();
      userItem.remove();
      answer.remove();
      if (!el.prompt.value) el.prompt.value = text;
      if (!pending.length) {
        pending = images;
        renderPending();
      }
    } else {
      conversation.push({ role: "assistant", content: partial });
      const parts = [];
      if (completionTokens !== null) {
        parts.push(`${completionTokens} tokens`);
        // Decode speed: the tokens after the first, over the time they took.
        const seconds = firstTokenAt === null ? 0 : (lastTokenAt - firstTokenAt) / 1000;
        if (seconds > 0 && completionTokens > 1) {
          parts.push(`${((completionTokens - 1) / seconds).toFixed(1)} tokens/s`);
        }
      }
      if (finishReason) parts.push(finishReason === "length" ? "hit max tokens" : finishReason);
      if (parts.length) setMeta(answer, parts.join(" · "));
    }
    if (streamError) {
      addMessage("error", streamError);
      el.status.textContent = "The request failed.";
    } else {
      el.status.textContent = request.stopped ? "Stopped." : "";
    }
    el.prompt.focus();
  }

  function stop() {
    if (!inFlight) return;
    inFlight.stopped = true;
    // Closing the connection is the cancel: the server aborts the request and frees its blocks.
    inFlight.controller.abort();
  }

  function newChat() {
    stop();
    history = [];
    for (const item of [...el.messages.querySelectorAll(".msg")]) item.remove();
    el.hint.hidden = false;
    el.status.textContent = "";
    el.prompt.value = "";
    pending = [];
    renderPending();
    el.prompt.focus();
  }

  // ---- model name ----

  async function loadModel() {
    try {
      const response = await fetch("/v1/models", { headers: authHeaders(), cache: "no-store" });
      if (!response.ok) {
        modelId = null;
        el.model.textContent =
          response.status === 401 ? "model: (enter the API key)" : `model: (error ${response.status})`;
        return;
      }
      const body = await response.json();
      modelId = body.data && body.data.length ? body.data[0].id : null;
      el.model.textContent = `model: ${modelId ?? "?"}`;
    } catch (_) {
      el.model.textContent = "model: (server unreachable)";
    }
  }

  // ---- the live panel, from /metrics ----

  let lastTokens = null; // {total, at}
  let metricsTimer = null;

  function parseMetrics(text) {
    // Sums each series over its labels: "name{labels} value" lines, comments skipped.
    const sums = new Map();
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const match = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!match) continue;
      const value = Number(match[3]);
      if (!Number.isFinite(value)) continue;
      sums.set(match[1], (sums.get(match[1]) || 0) + value);
    }
    return sums;
  }

  async function pollMetrics() {
    clearTimeout(metricsTimer);
    try {
      const response = await fetch("/metrics", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const m = parseMetrics(await response.text());
      const show = (node, value, format) => {
        node.textContent = value === undefined ? "–" : format(value);
      };
      show(el.running, m.get("vllm:num_requests_running"), (v) => String(Math.round(v)));
      show(el.waiting, m.get("vllm:num_requests_waiting"), (v) => String(Math.round(v)));
      show(el.kv, m.get("vllm:kv_cache_usage_perc"), (v) => `${(v * 100).toFixed(1)}%`);
      const total = m.get("vllm:generation_tokens_total");
      const now = performance.now();
      // A rate over less than half a second (an extra poll as an answer ends) is noise:
      // such a reading waits and joins the next window.
      if (total !== undefined && (!lastTokens || now - lastTokens.at >= 500)) {
        if (lastTokens) {
          const rate = Math.max(0, (total - lastTokens.total) / ((now - lastTokens.at) / 1000));
          el.tps.textContent = rate.toFixed(1);
        }
        lastTokens = { total, at: now };
      }
      el.metricsStatus.textContent = `from /metrics, ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      el.metricsStatus.textContent = `metrics unavailable: ${err.message || err}`;
    } finally {
      clearTimeout(metricsTimer);
      metricsTimer = setTimeout(pollMetrics, METRICS_INTERVAL_MS);
    }
  }

  // ---- wiring ----

  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  el.prompt.addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter is a newline; Enter while an IME composes is the IME's.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  el.attach.addEventListener("click", () => el.imageFile.click());
  el.imageFile.addEventListener("change", () => {
    const files = [...el.imageFile.files];
    el.imageFile.value = ""; // choosing the same file again is a change too
    addImages(files);
  });
  // Paste anywhere on the page; only a paste that holds files is taken from the browser.
  document.addEventListener("paste", (event) => {
    const files = filesOf(event.clipboardData);
    if (!files.length) return;
    event.preventDefault();
    addImages(files);
  });
  // Drop anywhere: without preventDefault the browser would leave the page to show the file.
  const carriesFiles = (event) =>
    event.dataTransfer && [...event.dataTransfer.types].includes("Files");
  document.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
    el.form.classList.add("drop-target");
  });
  document.addEventListener("dragleave", (event) => {
    if (!event.relatedTarget) el.form.classList.remove("drop-target"); // left the window
  });
  document.addEventListener("drop", (event) => {
    el.form.classList.remove("drop-target");
    const files = filesOf(event.dataTransfer);
    if (!files.length) return;
    event.preventDefault();
    addImages(files);
  });
  el.stop.addEventListener("click", stop);
  el.newChat.addEventListener("click", newChat);

  // A narrow window opens on the chat: the settings fold away (a click unfolds them).
  if (window.matchMedia("(max-width: 760px)").matches) $("settings").open = false;
  restoreSettings();
  setBusy(false);
  loadModel();
  pollMetrics();
  el.prompt.focus();
})();
