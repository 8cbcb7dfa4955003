// The live page: subscribe to one publisher of a reactive listener over a
// WebSocket and show its messages as they arrive, with Reactive Streams' demand.
// The wire format is docs/protocols/reactive-streams.md: every message is one
// MessagePack array [type, ...fields]. MessagePack is the vendored
// @msgpack/msgpack (msgpack.min.js, see msgpack.SOURCE). No framework, text only.
"use strict";

const VERSION = 0;
const KEEPALIVE = 1;
const SID = 1; // one subscription per connection, so its id is never reused
const SHOWN = 500; // messages kept on the page
const GOODBYE_WAIT_MS = 2000; // how long our goodbye waits for its answer
const LIMITS = { maxStrLength: 65536, maxBinLength: 16 << 20, maxArrayLength: 1024, maxMapLength: 1024 };

const T = {
  clientHello: 1, serverHello: 2, goodbye: 3, goodbyeAck: 4, subscribe: 5, request: 6,
  cancel: 7, subscribed: 8, onNext: 9, onComplete: 10, onError: 11, onNextPacked: 12,
  onNextPart: 13, onNextLastPart: 14, ping: 64, pong: 65,
};

// The fields each received type must have (the publisher side's messages, the
// server's hello, goodbyes, keepalive; a subscribe/request/cancel is the peer
// subscribing to us, handled apart).
const FIELDS = {
  [T.serverHello]: ["uint", "ids"], [T.goodbye]: ["str"], [T.goodbyeAck]: ["str"],
  [T.subscribe]: ["str", "uint", "uint"], [T.request]: ["uint", "uint"], [T.cancel]: ["uint"],
  [T.subscribed]: ["uint", "uint"], [T.onNext]: ["uint", "bin"], [T.onComplete]: ["uint"],
  [T.onError]: ["uint", "str"], [T.onNextPacked]: ["uint", "uint", "bin"],
  [T.onNextPart]: ["uint", "uint", "bin"], [T.onNextLastPart]: ["uint", "uint", "bin"],
  [T.ping]: ["bin"], [T.pong]: ["bin"],
};

class ProtocolError extends Error {}

const $ = (id) => document.getElementById(id);
const utf8 = new TextDecoder("utf-8", { fatal: true });

function isUint(v) { return typeof v === "number" && Number.isInteger(v) && v >= 0; }

function fieldOk(kind, v) {
  if (kind === "uint") return isUint(v);
  if (kind === "str") return typeof v === "string";
  if (kind === "bin") return v instanceof Uint8Array;
  return Array.isArray(v) && v.every(isUint); // ids
}

// Throws ProtocolError unless msg is [type, ...fields] with the fields its type needs.
function check(msg, extensions) {
  if (!Array.isArray(msg) || !isUint(msg[0])) throw new ProtocolError("not a message array");
  const type = msg[0];
  if (type >= 64 && type < 128 && !(type <= T.pong && extensions.has(KEEPALIVE))) return false;
  const kinds = FIELDS[type];
  if (!kinds) throw new ProtocolError("unexpected message type " + type);
  if (msg.length !== kinds.length + 1 || !kinds.every((k, i) => fieldOk(k, msg[i + 1]))) {
    throw new ProtocolError("bad fields for message type " + type);
  }
  return true;
}

// What a message's bytes say: its text when it is UTF-8, else its first bytes in hex.
function describe(bytes) {
  try {
    return utf8.decode(bytes);
  } catch {
    const hex = Array.from(bytes.subarray(0, 32), (b) => b.toString(16).padStart(2, "0")).join(" ");
    return "(" + bytes.length + " bytes) " + hex + (bytes.length > 32 ? " …" : "");
  }
}

// An async iterable of the WebSocket's binary messages, for decodeMultiStream:
// MessagePack messages may span WebSocket messages, and a WebSocket message may hold many.
function channel() {
  const items = [];
  let wake = null;
  let closed = false;
  const poke = () => { if (wake) { wake(); wake = null; } };
  return {
    push(item) { items.push(item); poke(); },
    close() { closed = true; poke(); },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        if (items.length) yield items.shift();
        else if (closed) return;
        else await new Promise((resolve) => { wake = resolve; });
      }
    },
  };
}

// The page's one connection: the handshake, the subscription and its demand.
class Live {
  constructor(url, publisher, size) {
    this.publisher = publisher;
    this.window = size;
    this.extensions = new Set();
    this.helloSeen = false;
    this.subscribed = false;
    this.elementSize = 0;
    this.ended = false; // the subscription ended (terminal signal, cancel, goodbye)
    this.cancelled = false;
    this.goodbyeSent = false;
    this.goodbyeDone = false; // a goodbye received, or ours answered
    this.paused = false;
    this.part = null; // {id, chunks} of a split element being joined
    this.counts = { received: 0, requested: 0, requests: 0, outstanding: 0, pings: 0 };
    this.opened = false;
    this.stopping = false;
    this.input = channel();
    this.ws = new WebSocket(url);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => this.opened_();
    this.ws.onmessage = (e) => this.received_(e.data);
    this.ws.onclose = (e) => this.closed_(e);
    this.ws.onerror = () => {}; // onclose follows and says it
    state("connecting");
    this.read();
  }

  send(...messages) {
    if (this.ws.readyState !== WebSocket.OPEN) return;
    for (const m of messages) this.ws.send(MessagePack.encode(m));
  }

  opened_() {
    this.opened = true;
    signal("connected to " + this.ws.url);
    // The client may pipeline its subscribe right behind its hello.
    this.send([T.clientHello, VERSION, [KEEPALIVE]], [T.subscribe, this.publisher, SID, this.window]);
    this.counts.requested = this.counts.outstanding = this.window;
    this.counts.requests = 1;
    counters(this.counts);
    state("subscribing");
  }

  received_(data) {
    if (typeof data === "string") data = new TextEncoder().encode(data);
    this.input.push(new Uint8Array(data));
  }

  closed_(event) {
    this.input.close();
    if (this.stopping && !this.opened) {
      signal("stopped before the connection opened");
    } else if (!this.opened) {
      signal("could not connect to " + this.ws.url + ": the address is wrong, nothing listens there," +
        " or the listener refused this page's origin (add ?origin=" + location.origin +
        " to its ws:// address)", "bad");
    } else {
      // After the goodbyes, how the WebSocket closes says nothing more.
      const clean = this.goodbyeDone || event.code === 1000;
      signal((clean ? "closed (" : "closed without a goodbye (") + event.code +
        (event.reason ? " " + event.reason : "") + ")", clean ? "" : "bad");
    }
    this.ended = true;
    clearTimeout(this.goodbyeTimer);
    state("closed");
    buttons(null);
  }

  async read() {
    try {
      for await (const msg of MessagePack.decodeMultiStream(this.input, LIMITS)) {
        if (!this.helloSeen && !(Array.isArray(msg) && msg[0] === T.serverHello)) {
          throw new ProtocolError("expected the serverHello first");
        }
        if (check(msg, this.extensions)) this.handle(msg);
      }
    } catch (e) {
      // End of input in the middle of a message: the partial message is dropped.
      if (!(e instanceof ProtocolError) && this.ws.readyState >= WebSocket.CLOSING) return;
      this.protocolError(e instanceof ProtocolError ? e.message : "undecodable: " + e.message);
    }
  }

  protocolError(what) {
    signal("protocol error: " + what, "bad");
    if (!this.goodbyeSent) this.goodbye("protocol-error: " + what);
    this.ws.close(1000);
  }

  handle(msg) {
    const [type, ...f] = msg;
    if (this.goodbyeSent && type !== T.goodbye && type !== T.goodbyeAck) return; // crossed our goodbye
    switch (type) {
      case T.serverHello: return this.hello(f[0], f[1]);
      case T.goodbye: return this.goodbyeReceived(f[0]);
      case T.goodbyeAck: return this.goodbyeAnswered(f[0]);
      case T.ping: this.send([T.pong, f[0]]); this.counts.pings++; return counters(this.counts);
      case T.pong: return;
      case T.subscribe: return this.send([T.onError, f[1], "this page publishes nothing"]);
      case T.request: throw new ProtocolError("request for a subscription never made");
      case T.cancel: return; // crosses our rejection
    }
    if (f[0] !== SID) throw new ProtocolError("a message for subscription " + f[0] + ", never made");
    if (this.ended) {
      if (this.cancelled) return; // in flight when we cancelled
      throw new ProtocolError("a message after the subscription ended");
    }
    if (type === T.subscribed) return this.accepted(f[1]);
    if (type === T.onError) return this.terminal("onError: " + f[1], "failed");
    if (!this.subscribed) throw new ProtocolError("a signal before subscribed");
    if (this.part && type !== T.onNextPart && type !== T.onNextLastPart) {
      throw new ProtocolError("a split element left unfinished");
    }
    switch (type) {
      case T.onNext: return this.elements([this.sized(f[1])]);
      case T.onNextPacked: return this.elements(this.unpack(f[1], f[2]));
      case T.onNextPart: return this.joinPart(f[1], f[2], false);
      case T.onNextLastPart: return this.joinPart(f[1], f[2], true);
      case T.onComplete: return this.terminal("onComplete", "completed");
    }
  }

  hello(version, extensions) {
    if (this.helloSeen) throw new ProtocolError("a second hello");
    this.helloSeen = true;
    if (version !== VERSION) {
      signal("the server speaks version " + version + ", this page " + VERSION, "bad");
      this.goodbye("unsupported-version: " + version);
      return;
    }
    this.extensions = new Set(extensions.filter((x) => x === KEEPALIVE));
  }

  accepted(elementSize) {
    if (this.subscribed) throw new ProtocolError("a second subscribed");
    this.subscribed = true;
    this.elementSize = elementSize;
    signal("subscribed to " + this.publisher + (elementSize ? " (elements of " + elementSize + " bytes)" : ""));
    state(this.paused ? "paused" : "subscribed");
  }

  sized(element) {
    if (this.elementSize && element.length !== this.elementSize) {
      throw new ProtocolError("an element of " + element.length + " bytes, not " + this.elementSize);
    }
    return element;
  }

  unpack(count, blob) {
    if (!this.elementSize || count < 1 || blob.length !== count * this.elementSize) {
      throw new ProtocolError("a packed message that does not fit the element size");
    }
    const out = [];
    for (let i = 0; i < count; i++) out.push(blob.subarray(i * this.elementSize, (i + 1) * this.elementSize));
    return out;
  }

  joinPart(id, data, last) {
    if (this.elementSize) throw new ProtocolError("a split element of a fixed size");
    if (!this.part) {
      this.spend(1); // a split element is charged at its first part
      this.part = { id, chunks: [], size: 0 };
    } else if (this.part.id !== id) {
      throw new ProtocolError("a part of another element");
    }
    this.part.chunks.push(data);
    this.part.size += data.length;
    if (this.part.size > LIMITS.maxBinLength) throw new ProtocolError("a split element beyond 16 MiB");
    if (!last) return;
    const whole = new Uint8Array(this.part.size);
    let at = 0;
    for (const c of this.part.chunks) { whole.set(c, at); at += c.length; }
    this.part = null;
    this.show([whole]);
  }

  spend(n) {
    if (n > this.counts.outstanding) throw new ProtocolError("more elements than requested");
    this.counts.outstanding -= n;
  }

  elements(list) {
    this.spend(list.length);
    this.show(list);
  }

  // Show elements, then ask for more: a window's worth once half of it is used.
  show(list) {
    this.counts.received += list.length;
    messages(list, this.counts.received);
    this.demand();
  }

  demand() {
    const c = this.counts;
    if (!this.paused && !this.ended && c.outstanding <= this.window / 2) {
      const n = this.window - c.outstanding;
      this.send([T.request, SID, n]);
      c.requested += n;
      c.outstanding += n;
      c.requests++;
    }
    counters(c);
  }

  pause(on) {
    this.paused = on;
    if (this.subscribed && !this.ended) state(on ? "paused" : "subscribed");
    if (!on) this.demand();
  }

  terminal(what, how) {
    this.ended = true;
    signal(what, how === "failed" ? "bad" : "");
    state(how);
    this.goodbye("done");
  }

  // Stop: cancel the subscription if it runs, then say goodbye.
  stop() {
    if (this.ws.readyState === WebSocket.CONNECTING) {
      this.stopping = true;
      return this.ws.close();
    }
    if (this.subscribed && !this.ended) {
      this.send([T.cancel, SID]);
      this.ended = this.cancelled = true;
      signal("cancelled");
    }
    this.goodbye("stopped by the page");
  }

  goodbye(reason) {
    if (this.goodbyeSent) return;
    this.goodbyeSent = true;
    this.send([T.goodbye, reason]);
    this.goodbyeTimer = setTimeout(() => this.ws.close(1000), GOODBYE_WAIT_MS);
  }

  goodbyeReceived(reason) {
    signal("goodbye: " + reason, reason.startsWith("protocol-error") ? "bad" : "");
    this.goodbyeDone = true;
    if (!this.goodbyeSent) this.send([T.goodbyeAck, "bye"]);
    if (!this.ended) { this.ended = true; state("ended"); }
    this.ws.close(1000);
  }

  goodbyeAnswered(message) {
    if (!this.goodbyeSent) throw new ProtocolError("a goodbyeAck without our goodbye");
    this.goodbyeDone = true;
    this.ws.close(1000);
  }
}

// -- the page -------------------------------------------------------------------

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function state(text) {
  const badge = $("state");
  badge.textContent = text;
  badge.className = "badge " + ({ subscribed: "ok", completed: "ok", paused: "warn", failed: "bad" }[text] || "");
}

function signal(text, cls) {
  $("signals").appendChild(el("li", text, cls));
}

function counters(c) {
  for (const k of Object.keys(c)) $(k).textContent = String(c[k]);
}

function messages(list, last) {
  const ol = $("messages");
  list.forEach((bytes, i) => {
    const li = el("li", describe(bytes));
    li.value = last - list.length + i + 1;
    ol.appendChild(li);
  });
  while (ol.children.length > SHOWN) ol.firstElementChild.remove();
}

function buttons(live) {
  $("pause").disabled = $("stop").disabled = !live;
  $("pause").textContent = live && live.paused ? "Resume" : "Pause";
}

function start() {
  const q = new URLSearchParams(location.search);
  $("origin").textContent = location.origin;
  for (const k of ["ws", "publisher", "window"]) if (q.get(k)) $(k).value = q.get(k);
  if (!q.get("ws") || !q.get("publisher")) return;
  const size = Math.max(1, Math.min(65536, parseInt($("window").value, 10) || 16));
  let live;
  try {
    live = new Live(q.get("ws"), q.get("publisher"), size);
  } catch (e) {
    signal("bad WebSocket address: " + e.message, "bad");
    return;
  }
  buttons(live);
  $("pause").onclick = () => { live.pause(!live.paused); buttons(live); };
  $("stop").onclick = () => live.stop();
}

start();
