//! Data: IDX files, data sets, image folders, PNG grids, the embedded sample and the full-data loader.
