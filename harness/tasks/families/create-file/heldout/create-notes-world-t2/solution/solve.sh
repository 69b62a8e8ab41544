#!/bin/bash
echo world > /app/notes.txt
