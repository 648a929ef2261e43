//! The control plane's state (PolarFS section 3.2.3, PolarCtrl).
