/* Micromessage2's two hot loops in C: scanning a run of plain MESSAGE frames and
 * framing a batch of deliveries. Optional: frames.py has the same loops in Python
 * and uses them when this module is not built; tests/micromessage/test_speedups.py
 * checks that both give the same results.
 *
 * Each function does only the common case and leaves everything else to the
 * Python code, so that errors are raised (and worded) in one place:
 *
 * scan_messages(data, pos, limit, cap, message_type) -> (frames, end)
 *     Plain MESSAGE frames from data[pos:] (flags 0 or LARGE_PAYLOAD only, seq not 0,
 *     ASCII destination and properties, payload length at most cap), at most limit
 *     of them, as message_type(seq, destination, properties, payload) instances;
 *     stops before the first frame that is anything else or not whole yet. end is
 *     where it stopped.
 *
 * encode_messages(first, items, max_fragment) -> (blob, ends) or None
 *     MESSAGE frames numbered from first (1..65535, wrapping to 1) for items of
 *     (destination, properties, payload); None when any item needs the general
 *     encoder (a payload over max_fragment, text that is not ASCII or too long, not
 *     exactly (str, str, bytes)), which then frames the whole batch and refuses what
 *     it must.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define LARGE 0x08
#define MAX_SMALL 255

static int
is_ascii(const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] & 0x80)
            return 0;
    }
    return 1;
}

static PyObject *
make_message(PyTypeObject *type, long seq, PyObject *dest, PyObject *props,
             const char *payload, Py_ssize_t n)
{
    PyObject *m = type->tp_alloc(type, 4);
    if (m == NULL)
        return NULL;
    PyObject *s = PyLong_FromLong(seq);
    PyObject *b = PyBytes_FromStringAndSize(payload, n);
    if (s == NULL || b == NULL) {
        Py_XDECREF(s);
        Py_XDECREF(b);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(dest);
    Py_INCREF(props);
    PyTuple_SET_ITEM(m, 0, s);
    PyTuple_SET_ITEM(m, 1, dest);
    PyTuple_SET_ITEM(m, 2, props);
    PyTuple_SET_ITEM(m, 3, b);
    return m;
}

static PyObject *
scan_messages(PyObject *self, PyObject *args)
{
    PyObject *data, *type;
    Py_ssize_t pos, limit, cap;
    if (!PyArg_ParseTuple(args, "OnnnO!", &data, &pos, &limit, &cap, &PyType_Type, &type))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "message_type must be a tuple subclass");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t end = view.len;
    PyObject *out = PyList_New(0);
    PyObject *empty = PyUnicode_New(0, 0);
    PyObject *dest = NULL; /* the last destination's str, and its bytes in buf */
    const unsigned char *dest_raw = NULL;
    Py_ssize_t dest_len = -1;
    Py_ssize_t p = pos < 0 ? end : pos;
    if (out == NULL || empty == NULL)
        goto fail;
    while (p + 4 <= end && PyList_GET_SIZE(out) < limit) {
        unsigned flags = buf[p];
        long seq = (long)buf[p + 1] << 8 | buf[p + 2];
        Py_ssize_t dlen = buf[p + 3];
        Py_ssize_t q = p + 4 + dlen;
        if ((flags & ~LARGE) || seq == 0 || q + 2 > end)
            break;
        Py_ssize_t plen = (Py_ssize_t)buf[q] << 8 | buf[q + 1];
        Py_ssize_t r = q + 2 + plen;
        Py_ssize_t n;
        if (flags) {
            if (r + 4 > end)
                break;
            n = (Py_ssize_t)((unsigned long)buf[r] << 24 | (unsigned long)buf[r + 1] << 16 |
                             (unsigned long)buf[r + 2] << 8 | buf[r + 3]);
            r += 4;
        } else {
            if (r >= end)
                break;
            n = buf[r];
            r += 1;
        }
        if (n > cap || r + n > end)
            break;
        if (dest == NULL || dlen != dest_len || memcmp(dest_raw, buf + p + 4, dlen) != 0) {
            if (!is_ascii(buf + p + 4, dlen))
                break;
            PyObject *d = PyUnicode_DecodeASCII((const char *)buf + p + 4, dlen, NULL);
            if (d == NULL)
                goto fail;
            Py_XSETREF(dest, d);
            dest_raw = buf + p + 4;
            dest_len = dlen;
        }
        PyObject *props;
        if (plen) {
            if (!is_ascii(buf + q + 2, plen))
                break;
            props = PyUnicode_DecodeASCII((const char *)buf + q + 2, plen, NULL);
            if (props == NULL)
                goto fail;
        } else {
            props = Py_NewRef(empty);
        }
        PyObject *m = make_message((PyTypeObject *)type, seq, dest, props,
                                   (const char *)buf + r, n);
        Py_DECREF(props);
        if (m == NULL)
            goto fail;
        int appended = PyList_Append(out, m);
        Py_DECREF(m);
        if (appended < 0)
            goto fail;
        p = r + n;
    }
    Py_XDECREF(dest);
    Py_DECREF(empty);
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, p < pos ? pos : p);
fail:
    Py_XDECREF(dest);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
encode_messages(PyObject *self, PyObject *args)
{
    long first;
    PyObject *items;
    Py_ssize_t max_fragment;
    if (!PyArg_ParseTuple(args, "lOn", &first, &items, &max_fragment))
        return NULL;
    if (first < 1 || first > 0xFFFF)
        Py_RETURN_NONE;
    PyObject *seq_items = PySequence_Fast(items, "items must be iterable");
    if (seq_items == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq_items);
    PyObject **all = PySequence_Fast_ITEMS(seq_items);
    /* First pass: check every item and size the blob. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *it = all[i];
        if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) != 3)
            goto general;
        PyObject *d = PyTuple_GET_ITEM(it, 0), *pr = PyTuple_GET_ITEM(it, 1),
                 *pl = PyTuple_GET_ITEM(it, 2);
        if (!PyUnicode_CheckExact(d) || !PyUnicode_CheckExact(pr) || !PyBytes_CheckExact(pl))
            goto general;
        if (!PyUnicode_IS_ASCII(d) || !PyUnicode_IS_ASCII(pr))
            goto general;
        Py_ssize_t dl = PyUnicode_GET_LENGTH(d), prl = PyUnicode_GET_LENGTH(pr),
                   n = PyBytes_GET_SIZE(pl);
        if (dl > 255 || prl > 65535 || n > max_fragment)
            goto general;
        total += (n > MAX_SMALL ? 10 : 7) + dl + prl + n;
    }
    PyObject *blob = PyBytes_FromStringAndSize(NULL, total);
    PyObject *ends = PyList_New(count);
    if (blob == NULL || ends == NULL) {
        Py_XDECREF(blob);
        Py_XDECREF(ends);
        Py_DECREF(seq_items);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(blob);
    Py_ssize_t at = 0;
    long seq = first;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *it = all[i];
        PyObject *d = PyTuple_GET_ITEM(it, 0), *pr = PyTuple_GET_ITEM(it, 1),
                 *pl = PyTuple_GET_ITEM(it, 2);
        Py_ssize_t dl = PyUnicode_GET_LENGTH(d), prl = PyUnicode_GET_LENGTH(pr),
                   n = PyBytes_GET_SIZE(pl);
        o[at] = n > MAX_SMALL ? LARGE : 0;
        o[at + 1] = (unsigned char)(seq >> 8);
        o[at + 2] = (unsigned char)seq;
        o[at + 3] = (unsigned char)dl;
        at += 4;
        memcpy(o + at, PyUnicode_DATA(d), dl);
        at += dl;
        o[at] = (unsigned char)(prl >> 8);
        o[at + 1] = (unsigned char)prl;
        at += 2;
        memcpy(o + at, PyUnicode_DATA(pr), prl);
        at += prl;
        if (n > MAX_SMALL) {
            o[at] = (unsigned char)(n >> 24);
            o[at + 1] = (unsigned char)(n >> 16);
            o[at + 2] = (unsigned char)(n >> 8);
            o[at + 3] = (unsigned char)n;
            at += 4;
        } else {
            o[at++] = (unsigned char)n;
        }
        memcpy(o + at, PyBytes_AS_STRING(pl), n);
        at += n;
        PyObject *e = PyLong_FromSsize_t(at);
        if (e == NULL) {
            Py_DECREF(blob);
            Py_DECREF(ends);
            Py_DECREF(seq_items);
            return NULL;
        }
        PyList_SET_ITEM(ends, i, e);
        seq = seq < 0xFFFF ? seq + 1 : 1;
    }
    Py_DECREF(seq_items);
    return Py_BuildValue("(NN)", blob, ends);
general:
    Py_DECREF(seq_items);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan_messages", scan_messages, METH_VARARGS,
     "scan_messages(data, pos, limit, cap, message_type) -> (frames, end)"},
    {"encode_messages", encode_messages, METH_VARARGS,
     "encode_messages(first, items, max_fragment) -> (blob, ends) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "protocols.micromessage._speedups",
    "Micromessage2's frame scan and batch framing in C (optional).", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
